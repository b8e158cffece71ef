package main

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
)

// mains are the import paths of the main packages among pkgs (go build -v
// prints a main package before its link, which prints nothing).
func mains(ctx context.Context, flags, pkgs []string) []string {
	out, err := goList(ctx, append(append([]string{"-f", `{{if eq .Name "main"}}{{.ImportPath}}{{end}}`}, flags...), pkgs...))
	if err != nil {
		return nil
	}
	return out
}

// testDeps are the packages to compile before go test runs pkgs: every
// non-main package with Go files that the packages or their tests import,
// themselves included, without the test variants (compiled with _test.go
// files) and test mains go test builds itself. go build compiles them into
// the build cache go test then reads, and links nothing.
func testDeps(ctx context.Context, flags, pkgs []string) ([]string, error) {
	args := append([]string{"-e", "-deps", "-test", "-f", `{{if and (ne .Name "main") (not .ForTest) (or .GoFiles .CgoFiles)}}{{.ImportPath}}{{end}}`}, flags...)
	return goList(ctx, append(args, pkgs...))
}

func goList(ctx context.Context, args []string) ([]string, error) {
	cmd := exec.CommandContext(ctx, "go", append([]string{"list"}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	var lines []string
	seen := map[string]bool{}
	for _, l := range strings.Split(string(out), "\n") {
		if l != "" && !seen[l] {
			seen[l] = true
			lines = append(lines, l)
		}
	}
	return lines, nil
}
