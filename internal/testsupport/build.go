package testsupport

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"sync"

	"github.com/latchcsi/latch/internal/buildprogress"
)

// Module is latch's module path.
const Module = "github.com/latchcsi/latch"

var builds struct {
	mu   sync.Mutex
	dir  string
	done map[string]*build
	// progress, if set (SetBuildProgress), receives what is built and
	// progress lines while go build runs.
	progress io.Writer
}

// SetBuildProgress makes later builds (Binary, UpstreamBinary) print what
// they build and, while go build runs, a progress line at least every ten
// seconds to w (nil: silent, the default). latch-local passes its standard
// error: a cold build of kube-controller-manager takes minutes, and a
// newcomer's first run must not look hung. It is process-wide because the
// builds are (once per process, shared by every caller).
func SetBuildProgress(w io.Writer) {
	builds.mu.Lock()
	defer builds.mu.Unlock()
	builds.progress = w
}

type build struct {
	once sync.Once
	out  string
	path string
	err  error
}

// Binary builds a package of the module (e.g. "cmd/csi-attacher") once per
// process into a shared temporary directory and returns the binary's path.
// Extra go build flags (e.g. "-tags", "grpcnotrace") make a build of their
// own. RemoveBinaries deletes them (call it from TestMain).
func Binary(pkg string, flags ...string) (string, error) {
	return buildOnce("", Module+"/"+strings.TrimPrefix(pkg, "./"), flags...)
}

// buildOnce builds importPath once per process (per importPath and flags)
// with the go command run in dir ("" = the current directory, i.e. inside
// latch's module) and returns the binary's path.
func buildOnce(dir, importPath string, flags ...string) (string, error) {
	key := strings.Join(append([]string{dir, importPath}, flags...), " ")
	builds.mu.Lock()
	if builds.done == nil {
		builds.done = map[string]*build{}
	}
	if builds.dir == "" {
		tmp, err := os.MkdirTemp("", "latch-bin")
		if err != nil {
			builds.mu.Unlock()
			return "", fmt.Errorf("build %s: %w", importPath, err)
		}
		builds.dir = tmp
	}
	b := builds.done[key]
	if b == nil {
		b = &build{out: filepath.Join(builds.dir, fmt.Sprintf("%d", len(builds.done)), path.Base(importPath))}
		builds.done[key] = b
	}
	progress := builds.progress
	builds.mu.Unlock()
	b.once.Do(func() {
		if progress != nil {
			b.err = buildWithProgress(progress, dir, importPath, b.out, flags)
		} else {
			b.err = buildSilently(dir, importPath, b.out, flags)
		}
		if b.err == nil {
			b.path = b.out
		}
	})
	return b.path, b.err
}

func buildSilently(dir, importPath, out string, flags []string) error {
	args := append([]string{"build"}, flags...)
	args = append(args, "-o", out, importPath)
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	if msg, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s (in %q): %v\n%s", strings.Join(args, " "), dir, err, msg)
	}
	return nil
}

// buildWithProgress is go build -v with progress lines on w; what go build
// printed besides package names (errors) goes into the error.
func buildWithProgress(w io.Writer, dir, importPath, out string, flags []string) error {
	where := "latch's module"
	if dir != "" {
		where = dir
		if rel, err := filepath.Rel(filepath.Join(upstreamRoot(), "..", ".."), dir); err == nil && !strings.HasPrefix(rel, "..") {
			where = rel
		}
	}
	var msg bytes.Buffer
	b := buildprogress.Build{
		Label:       path.Base(importPath),
		What:        fmt.Sprintf("building %s from %s (a cold build takes minutes on two cores, later ones come from the Go build cache)", importPath, where),
		Dir:         dir,
		Flags:       flags,
		Output:      out,
		Packages:    []string{importPath},
		Mains:       []string{importPath},
		Progress:    w,
		Passthrough: downloadsTo{w, &msg},
	}
	if err := b.Run(context.Background()); err != nil {
		return fmt.Errorf("%w\n%s", err, msg.String())
	}
	return nil
}

// downloadsTo shows go's module downloads (progress too, on a cold module
// cache) and keeps every line for the error message.
type downloadsTo struct {
	progress io.Writer
	all      *bytes.Buffer
}

func (d downloadsTo) Write(line []byte) (int, error) {
	if bytes.HasPrefix(line, []byte("go: downloading ")) {
		_, _ = d.progress.Write(line)
	}
	return d.all.Write(line)
}

// MustBinary is Binary that fails the test.
func MustBinary(t TB, pkg string, flags ...string) string {
	t.Helper()
	p, err := Binary(pkg, flags...)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return p
}

// RemoveBinaries deletes every binary Binary built.
func RemoveBinaries() {
	builds.mu.Lock()
	defer builds.mu.Unlock()
	if builds.dir != "" {
		os.RemoveAll(builds.dir)
		builds.dir = ""
		builds.done = nil
	}
}
