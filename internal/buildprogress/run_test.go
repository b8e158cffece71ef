package buildprogress

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/latchcsi/latch/internal/testsupport/gomodule"
)

// module writes a tiny module (stdlib only: it compiles in a second) with
// a library and a command, and returns its directory.
func module(t *testing.T, lib string) string {
	t.Helper()
	return gomodule.Write(t, "example.com/m", map[string]string{
		"lib/lib.go":      lib,
		"cmd/app/main.go": "package main\n\nimport \"example.com/m/lib\"\n\nfunc main() { println(lib.Answer()) }\n",
	})
}

func TestBuildRunCompilesWithProgress(t *testing.T) {
	dir := module(t, "package lib\n\nfunc Answer() int { return 42 }\n")
	var progress, rest bytes.Buffer
	out := filepath.Join(t.TempDir(), "app")
	b := Build{Label: "app", Dir: dir, Output: out, Packages: []string{"./cmd/app"}, Mains: []string{"example.com/m/cmd/app"}, Progress: &progress, Passthrough: &rest}
	if err := b.Run(context.Background()); err != nil {
		t.Fatalf("Run: %v\nprogress:\n%s\nrest:\n%s", err, progress.String(), rest.String())
	}
	lines := strings.Split(strings.TrimSpace(progress.String()), "\n")
	if lines[0] != "app: go build ./cmd/app" || !strings.HasPrefix(lines[len(lines)-1], "app: done in ") {
		t.Errorf("progress lines = %q, want the command first and the result last", lines)
	}
	if !strings.Contains(lines[len(lines)-1], "(2 compiled") {
		t.Errorf("last line %q: want the two packages of the module counted (a fresh module is never cached)", lines[len(lines)-1])
	}
	if rest.Len() != 0 {
		t.Errorf("package names leaked to the pass-through output: %q", rest.String())
	}
	if msg, err := exec.Command(out).CombinedOutput(); err != nil || strings.TrimSpace(string(msg)) != "42" {
		t.Errorf("built binary printed %q, %v; want 42", msg, err)
	}
}

// Linking is called once, when go build has reported every main package:
// every package is compiled then, and no binary is written yet (the links
// follow). Two mains: not at the first of them.
func TestBuildRunCallsLinkingOnceWhenOnlyTheLinksRemain(t *testing.T) {
	dir := gomodule.Write(t, "example.com/m", map[string]string{
		"lib/lib.go":        "package lib\n\nfunc Answer() int { return 42 }\n",
		"cmd/app/main.go":   "package main\n\nimport \"example.com/m/lib\"\n\nfunc main() { println(lib.Answer()) }\n",
		"cmd/other/main.go": "package main\n\nimport \"example.com/m/lib\"\n\nfunc main() { println(lib.Answer() + 1) }\n",
	})
	out := t.TempDir()
	var calls int
	var atCall []string // the binaries in out when Linking ran
	var progress bytes.Buffer
	b := Build{Label: "app", Dir: dir, Output: out + string(filepath.Separator), Packages: []string{"./cmd/..."},
		Mains: []string{"example.com/m/cmd/app", "example.com/m/cmd/other"}, Progress: &progress, Passthrough: &progress,
		Linking: func() {
			calls++
			atCall, _ = filepath.Glob(filepath.Join(out, "*"))
		}}
	if err := b.Run(context.Background()); err != nil {
		t.Fatalf("Run: %v\n%s", err, progress.String())
	}
	if calls != 1 {
		t.Fatalf("Linking called %d times, want once", calls)
	}
	if len(atCall) != 0 {
		t.Errorf("binaries %q existed when Linking was called: want it called before the links", atCall)
	}
	for _, bin := range []string{"app", "other"} {
		if _, err := os.Stat(filepath.Join(out, bin)); err != nil {
			t.Errorf("binary %s: %v", bin, err)
		}
	}
}

// A compile error is shown as go printed it, the failure is returned and
// named, and the last progress line says the build failed.
func TestBuildRunPassesErrorsThrough(t *testing.T) {
	dir := module(t, "package lib\n\nfunc Answer() int { return undefinedThing }\n")
	var progress, rest bytes.Buffer
	b := Build{Label: "app", Dir: dir, Packages: []string{"./cmd/app"}, Progress: &progress, Passthrough: &rest}
	err := b.Run(context.Background())
	var exit *exec.ExitError
	if !errors.As(err, &exit) || !strings.Contains(err.Error(), "go build -v ./cmd/app") {
		t.Fatalf("Run = %v, want go build's exit error naming the command", err)
	}
	if !strings.Contains(rest.String(), "# example.com/m/lib") || !strings.Contains(rest.String(), "lib.go:3:") || !strings.Contains(rest.String(), "undefinedThing") {
		t.Errorf("pass-through output %q: want go's compile error as printed", rest.String())
	}
	if !strings.Contains(progress.String(), "app: build failed after ") {
		t.Errorf("progress %q: want the failure in the last line", progress.String())
	}
}

// go test's standard output reaches stdout unchanged (CI reads the summary
// lines) and its exit code is returned.
func TestRunTestPassesOutputAndExitCode(t *testing.T) {
	var stdout, stderr bytes.Buffer
	script := `printf 'ok  \texample.com/a\t0.1s\n'; printf 'FAIL\texample.com/b\t0.2s\n'; printf 'no newline'; echo oops >&2; exit 3`
	err := RunTest(context.Background(), "make test", []string{"sh", "-c", script}, []string{"std"}, &stdout, &stderr)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 3 {
		t.Fatalf("RunTest = %v, want exit status 3", err)
	}
	if want := "ok  \texample.com/a\t0.1s\nFAIL\texample.com/b\t0.2s\nno newline"; stdout.String() != want {
		t.Errorf("stdout = %q, want %q", stdout.String(), want)
	}
	if stderr.String() != "oops\n" {
		t.Errorf("stderr = %q, want the command's own", stderr.String())
	}
}

// SIGTERM to make's progress printer (a cancelled context) interrupts go
// test as Ctrl-C would, so it can end its test binaries, instead of
// killing it and leaving them running.
func TestRunTestInterruptsOnCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Cancel once the command has set its trap and said so: a fixed delay
	// cancelled a command on a loaded machine before its shell had started.
	stdout := &noticeWriter{want: "started\n", seen: make(chan struct{})}
	go func() {
		select {
		case <-stdout.seen:
		case <-time.After(5 * time.Second):
		}
		cancel()
	}()
	var stderr bytes.Buffer
	script := `trap 'kill $!; echo interrupted; exit 7' INT; echo started; sleep 20 & wait`
	start := time.Now()
	err := RunTest(ctx, "make test", []string{"sh", "-c", script}, []string{"std"}, stdout, &stderr)
	if err == nil || time.Since(start) > 10*time.Second {
		t.Fatalf("RunTest = %v after %s, want an error within seconds", err, time.Since(start))
	}
	if stdout.String() != "started\ninterrupted\n" {
		t.Errorf("stdout = %q, want the command's trap of SIGINT to have run", stdout.String())
	}
}

// noticeWriter keeps what is written and closes seen once it holds want.
type noticeWriter struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	want string
	seen chan struct{}
	once sync.Once
}

func (w *noticeWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if strings.Contains(w.buf.String(), w.want) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}

func (w *noticeWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// The builds collect less often unless the user chose a setting.
func TestBuildEnvSetsTheCollectorUnlessSet(t *testing.T) {
	got := BuildEnv([]string{"HOME=/h", "PATH=/p"})
	want := []string{"HOME=/h", "PATH=/p", "GOGC=" + buildGOGC, "GOMEMLIMIT=" + buildGOMEMLIMIT}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("BuildEnv = %q, want %q", got, want)
	}
	mine := []string{"GOGC=off", "GOMEMLIMIT=8GiB"}
	if got := BuildEnv(mine); strings.Join(got, " ") != strings.Join(mine, " ") {
		t.Errorf("BuildEnv(%q) = %q, want the user's settings kept and nothing added", mine, got)
	}
	in := []string{"PATH=/p"}
	BuildEnv(in)
	if len(in) != 1 {
		t.Errorf("BuildEnv changed its input")
	}
}
