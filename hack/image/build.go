package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// goBuild compiles ./cmd/<binary> for every binary into dir for platform p,
// as build/Dockerfile does: static (CGO_ENABLED=0), -trimpath, the given
// build tags, symbol tables left out (-s -w; the module list debug/buildinfo
// reads stays). The version is embedded by internal/version from its VERSION
// file; nothing is set with -X. GOAMD64 and GOARM64 are pinned to the
// baseline so that a developer's environment cannot make an image that
// needs a newer CPU, or a different digest. VCS stamping is asked for
// (-buildvcs=auto, whatever GOFLAGS says) so that the binary carries its
// commit and commit time (go version -m): the labels, the SBOM and every
// timestamp of the image come from them.
func goBuild(ctx context.Context, p platform, tags, dir string, binaries []string) error {
	args := []string{"build", "-trimpath", "-buildvcs=auto", "-ldflags=-s -w"}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	args = append(args, "-o", dir+string(os.PathSeparator))
	for _, b := range binaries {
		if strings.ContainsAny(b, `/\.`) || b == "" {
			return fmt.Errorf("binary %q: name a directory of cmd/", b)
		}
		args = append(args, "./cmd/"+b)
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+p.os, "GOARCH="+p.arch)
	switch p.arch {
	case "amd64":
		cmd.Env = append(cmd.Env, "GOAMD64=v1")
	case "arm64":
		cmd.Env = append(cmd.Env, "GOARM64=v8.0")
	}
	cmd.Stdout = os.Stderr
	cmd.Stderr = os.Stderr
	fmt.Fprintf(os.Stderr, "image: go %s (GOOS=%s GOARCH=%s CGO_ENABLED=0)\n", strings.Join(args, " "), p.os, p.arch)
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build for %s: %w", p, err)
	}
	return nil
}
