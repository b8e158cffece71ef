package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/latchcsi/latch/internal/testsupport/gomodule"
)

// The commands a newcomer runs go through this program: make demo, make up
// and make test each print the first-run line, build it, then run their
// command through it; CI runs exactly the README's test command.
func TestMakefileTargetsShowProgress(t *testing.T) {
	root := filepath.Join("..", "..")
	makefile, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	recipe := func(target string) string {
		m := regexp.MustCompile(`(?m)^` + target + `:.*\n((?:\t.*\n)+)`).FindSubmatch(makefile)
		if m == nil {
			t.Fatalf("Makefile: no target %q", target)
		}
		return string(m[1])
	}
	for target, want := range map[string]string{
		"demo": "$(PROGRESS) build -label \"make demo\" $(UPSTREAM_WARM) -o $(BIN_DIR)/latch-local ./cmd/latch-local -- $(BIN_DIR)/latch-local demo",
		"up":   "$(PROGRESS) build -label \"make up\" $(UPSTREAM_WARM) -o $(BIN_DIR)/latch-local ./cmd/latch-local -- $(BIN_DIR)/latch-local up",
		"test": "$(PROGRESS) test -label \"make test\" -- $(GO) test -count=1 -p $(TEST_PARALLEL) -timeout $(TEST_TIMEOUT) $(TEST_PACKAGES)",
	} {
		lines := strings.Split(strings.TrimRight(recipe(target), "\n"), "\n")
		if target != "test" {
			// demo and up start the module downloads first.
			if len(lines) < 2 || lines[1] != "\t@$(DOWNLOAD)" {
				t.Errorf("make %s runs\n%s\nwant @$(DOWNLOAD) second", target, strings.Join(lines, "\n"))
				continue
			}
			lines = slices.Delete(lines, 1, 2)
		}
		if len(lines) != 3 || !strings.HasPrefix(lines[0], "\t@echo \"make "+target+": a first run compiles ") || !strings.Contains(lines[0], "$(COLD)") ||
			lines[1] != "\t@$(BUILD_PROGRESS)" || lines[2] != "\t@"+want {
			t.Errorf("make %s runs\n%s\nwant the first-run line, @$(BUILD_PROGRESS), then @%s", target, strings.Join(lines, "\n"), want)
		}
	}
	for _, want := range []string{
		"PROGRESS := $(BIN_DIR)/buildprogress\n",
		"BUILD_PROGRESS := mkdir -p $(BIN_DIR) && $(GO) build -v -o $(PROGRESS) ./hack/buildprogress\n",
		"DOWNLOAD := ($(GO) list -deps ./cmd/latch-local >/dev/null 2>&1 &)\n",
		"COLD := minutes on 2 cores with an empty Go build cache (more with an empty module cache: the downloads), seconds when warm\n",
		// Every package runs (the longest first), four at a time.
		"TEST_PARALLEL ?= 4\n",
		"TEST_PACKAGES ?= ./test/interop/ ./test/e2e/attacher/ ./test/deploy/ ./test/e2e/reliability/ ./test/e2e/... ./internal/latchlocal/ ./bench/ ./cmd/latch-local/ ./internal/localcluster/ ./internal/attachdetach/controller/ ./...\n",
	} {
		if !bytes.Contains(makefile, []byte(want)) {
			t.Errorf("Makefile lacks %q", want)
		}
	}
	ci, err := os.ReadFile(filepath.Join(root, ".ci", "run"))
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(string(ci), "\nmake test\n") || !bytes.Contains(readme, []byte("\nmake test ")) {
		t.Errorf(".ci/run must end with the README's test command, make test")
	}
}

// This program compiles in seconds on a cold cache only if it imports
// nothing but the standard library and internal/buildprogress.
func TestImportsOnlyTheStandardLibrary(t *testing.T) {
	out, err := goList(t.Context(), []string{"-deps", "-f", `{{if not .Standard}}{{.ImportPath}}{{end}}`, "."})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	want := []string{"github.com/latchcsi/latch/hack/buildprogress", "github.com/latchcsi/latch/internal/buildprogress"}
	if !slices.Equal(out, want) {
		t.Errorf("non-standard dependencies = %q, want %q", out, want)
	}
}

// module writes a module with a library, a test-only helper package and a
// command, and changes into it.
func module(t *testing.T, lib string) {
	t.Helper()
	t.Chdir(gomodule.Write(t, "example.com/m", map[string]string{
		"lib/lib.go":          lib,
		"lib/lib_test.go":     "package lib\n\nimport \"testing\"\n\nfunc TestAnswer(t *testing.T) {}\n",
		"lib/x_test.go":       "package lib_test\n\nimport (\n\t\"testing\"\n\n\t\"example.com/m/helper\"\n)\n\nfunc TestX(t *testing.T) { helper.Help() }\n",
		"helper/helper.go":    "package helper\n\nfunc Help() {}\n",
		"onlytests/x_test.go": "package onlytests\n\nimport \"testing\"\n\nfunc TestY(t *testing.T) {}\n",
		"cmd/app/main.go":     "package main\n\nimport \"example.com/m/lib\"\n\nfunc main() { println(lib.Answer()) }\n",
	}))
}

// What make test compiles before go test: the packages and everything
// their tests import (helper is imported by a test only), never a test
// variant, a test main or a command (which go build would link).
func TestTestDeps(t *testing.T) {
	module(t, "package lib\n\nfunc Answer() int { return 42 }\n")
	deps, err := testDeps(t.Context(), nil, []string{"./..."})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"example.com/m/lib", "example.com/m/helper", "testing", "runtime"} {
		if !slices.Contains(deps, want) {
			t.Errorf("testDeps lacks %q: %q", want, deps)
		}
	}
	for _, d := range deps {
		if strings.Contains(d, ".test") || strings.Contains(d, " ") || d == "example.com/m/cmd/app" || d == "example.com/m/onlytests" {
			t.Errorf("testDeps has %q (a test variant, test main, command or test-only package)", d)
		}
	}
}

// make test: go test's standard output passes through unchanged and its
// exit code is make's; a package that does not compile does not stop the
// run (go test reports it, as it always did).
func TestRunTestMode(t *testing.T) {
	module(t, "package lib\n\nfunc Answer() int { return undefinedThing }\n")
	var stdout, stderr bytes.Buffer
	code := run([]string{"test", "-label", "make test", "--", "go", "test", "-count=1", "./..."}, &stdout, &stderr)
	if code != 1 {
		t.Errorf("exit code %d, want go test's 1", code)
	}
	for _, want := range []string{"FAIL\texample.com/m/lib [build failed]\n", "ok  \texample.com/m/onlytests\t"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout.String())
		}
	}
	for _, want := range []string{
		"make test: compiling the ",
		"undefinedThing",
		"make test: some packages did not compile (above); go test runs anyway and reports them\n",
		"make test: go test -count=1 ./...\n",
	} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr.String())
		}
	}
	if strings.Contains(stdout.String(), "make test:") {
		t.Errorf("progress lines on stdout:\n%s", stdout.String())
	}
}

// make demo: a build that fails stops before the command, with go's error.
func TestRunBuildModeStopsOnError(t *testing.T) {
	module(t, "package lib\n\nfunc Answer() int { return undefinedThing }\n")
	var stdout, stderr bytes.Buffer
	marker := filepath.Join(t.TempDir(), "ran")
	code := run([]string{"build", "-label", "make demo", "-o", filepath.Join(t.TempDir(), "app"), "./cmd/app", "--", "touch", marker}, &stdout, &stderr)
	if code != 1 {
		t.Errorf("exit code %d, want 1", code)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Errorf("the command ran after a failed build")
	}
	if !strings.Contains(stderr.String(), "undefinedThing") || !strings.Contains(stderr.String(), "make demo: build failed after ") {
		t.Errorf("stderr lacks go's error and the failure line:\n%s", stderr.String())
	}
}

// make demo with -warm: while the build links, the packages another
// module's commands import are compiled into the Go build cache (the
// command that builds them later only links), and the command runs after
// that compile has ended. The other module's library is new to the build
// cache (its text names this run's temporary directory), so a later go
// build -v of its command would print it had it not been compiled here.
func TestRunBuildModeWarmsTheOtherModule(t *testing.T) {
	module(t, "package lib\n\nfunc Answer() int { return 42 }\n")
	unique := t.TempDir()
	other := gomodule.Write(t, "example.com/up", map[string]string{
		"dep/dep.go":       "package dep\n\n// Where: " + unique + "\nfunc Where() string { return " + strconv.Quote(unique) + " }\n",
		"cmd/tool/main.go": "package main\n\nimport \"example.com/up/dep\"\n\nfunc main() { println(dep.Where()) }\n",
	})
	var stdout, stderr bytes.Buffer
	var ran []string
	var atRun string // the warm build's output when the command ran
	replaceWith = func(path string, argv, env []string) error {
		ran, atRun = argv, stderr.String()
		return nil
	}
	t.Cleanup(func() { replaceWith = syscall.Exec })
	run([]string{"build", "-label", "make demo", "-warm-dir", other, "-warm", "example.com/up/cmd/tool",
		"-o", filepath.Join(t.TempDir(), "app"), "./cmd/app", "--", "true", "demo"}, &stdout, &stderr)
	if !slices.Equal(ran, []string{"true", "demo"}) {
		t.Fatalf("ran %q, want the command after the build:\n%s", ran, stderr.String())
	}
	if !strings.Contains(atRun, "make demo (upstream): compiling the ") || !strings.Contains(atRun, " packages tool need (from "+other+") while the link runs") ||
		!strings.Contains(atRun, "make demo (upstream): done in ") {
		t.Errorf("when the command ran, the warm build had not begun and ended:\n%s", atRun)
	}
	build := exec.Command("go", "build", "-v", "-o", filepath.Join(t.TempDir(), "tool"), "./cmd/tool")
	build.Dir = other
	out, err := build.CombinedOutput()
	if err != nil {
		t.Fatalf("go build of the other module's command: %v\n%s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != "example.com/up/cmd/tool" {
		t.Errorf("go build -v of the other module's command compiled %q, want only its main package (the rest warmed)", got)
	}
}

// A failed build does not start the warm compile, and the command does
// not run.
func TestRunBuildModeDoesNotWarmAfterAFailedBuild(t *testing.T) {
	module(t, "package lib\n\nfunc Answer() int { return undefinedThing }\n")
	other := gomodule.Write(t, "example.com/up", map[string]string{
		"cmd/tool/main.go": "package main\n\nfunc main() {}\n",
	})
	var stdout, stderr bytes.Buffer
	code := run([]string{"build", "-label", "make demo", "-warm-dir", other, "-warm", "example.com/up/cmd/tool",
		"-o", filepath.Join(t.TempDir(), "app"), "./cmd/app", "--", "true"}, &stdout, &stderr)
	if code != 1 {
		t.Errorf("exit code %d, want 1", code)
	}
	if strings.Contains(stderr.String(), "(upstream)") {
		t.Errorf("the warm build ran after a failed build:\n%s", stderr.String())
	}
}
