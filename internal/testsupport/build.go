package testsupport

import (
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"sync"
)

// Module is latch's module path.
const Module = "github.com/latchcsi/latch"

var builds struct {
	mu   sync.Mutex
	dir  string
	done map[string]*build
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
	builds.mu.Unlock()
	b.once.Do(func() {
		args := append([]string{"build"}, flags...)
		args = append(args, "-o", b.out, importPath)
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		if msg, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go %s (in %q): %v\n%s", strings.Join(args, " "), dir, err, msg)
			return
		}
		b.path = b.out
	})
	return b.path, b.err
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
