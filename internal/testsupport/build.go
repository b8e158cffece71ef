package testsupport

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"

	"github.com/latchcsi/latch/internal/buildprogress"
)

// Module is latch's module path.
const Module = "github.com/latchcsi/latch"

var builds struct {
	mu sync.Mutex
	// dir is where this process's builds go: a directory of
	// binaryCacheDir, or (without one) a temporary directory
	// RemoveBinaries deletes.
	dir  string
	temp bool
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
// process into the directory BinaryDirEnv names and returns the binary's
// path.
// Extra go build flags (e.g. "-tags", "grpcnotrace") make a build of their
// own. RemoveBinaries deletes them (call it from TestMain).
func Binary(pkg string, flags ...string) (string, error) {
	return buildOnce("", Module+"/"+strings.TrimPrefix(pkg, "./"), flags...)
}

// keptBuild returns this process's build kept under key, made on first
// use with the output path out(the binaries' directory).
func keptBuild(key string, out func(binDir string) (string, error)) (*build, error) {
	builds.mu.Lock()
	defer builds.mu.Unlock()
	if builds.done == nil {
		builds.done = map[string]*build{}
	}
	if builds.dir == "" {
		d, temp, err := binaryDir()
		if err != nil {
			return nil, err
		}
		builds.dir, builds.temp = d, temp
	}
	b := builds.done[key]
	if b == nil {
		p, err := out(builds.dir)
		if err != nil {
			return nil, err
		}
		b = &build{out: p}
		builds.done[key] = b
	}
	return b, nil
}

// buildOnce builds importPath once per process (per importPath and flags)
// with the go command run in dir ("" = the current directory, i.e. inside
// latch's module) and returns the binary's path.
func buildOnce(dir, importPath string, flags ...string) (string, error) {
	return buildKept(path.Base(importPath), dir, []string{importPath}, flags)
}

// buildTogether builds the main packages importPaths of the module in dir
// in one go build once per process, into one directory, and returns the
// binaries' paths by import path. One go command compiles each package
// once for all of them (no two builds compiling the same package at the
// same time) and links them side by side on the machine's cores. label
// starts its progress lines.
func buildTogether(label, dir string, importPaths []string, flags ...string) (map[string]string, error) {
	out, err := buildKept(label, dir, importPaths, flags)
	if err != nil {
		return nil, err
	}
	bins := make(map[string]string, len(importPaths))
	for _, p := range importPaths {
		bins[p] = filepath.Join(out, path.Base(p))
	}
	return bins, nil
}

// buildKept builds importPaths once per process: one package into a file,
// several into a directory (go build -o dir/). It returns the file or the
// directory. label starts its progress lines.
func buildKept(label, dir string, importPaths []string, flags []string) (string, error) {
	what := strings.Join(importPaths, ", ")
	key := strings.Join(append([]string{dir, strings.Join(importPaths, " ")}, flags...), " ")
	b, err := keptBuild(key, func(binDir string) (string, error) {
		out, err := outputPath(binDir, dir, strings.Join(importPaths, " "), flags)
		if len(importPaths) > 1 {
			out = filepath.Dir(out)
		}
		return out, err
	})
	if err != nil {
		return "", fmt.Errorf("build %s: %w", what, err)
	}
	builds.mu.Lock()
	progress := builds.progress
	builds.mu.Unlock()
	b.once.Do(func() {
		out, lock := b.out, b.out
		if len(importPaths) > 1 {
			// go build -o dir/ writes one binary per main package into dir.
			out, lock = b.out+string(filepath.Separator), filepath.Join(b.out, "all")
		}
		unlock, err := lockOutput(lock)
		if err != nil {
			b.err = fmt.Errorf("build %s: %w", what, err)
			return
		}
		defer unlock()
		if progress != nil {
			b.err = buildWithProgress(progress, label, dir, importPaths, out, flags)
		} else {
			b.err = buildSilently(dir, importPaths, out, flags)
		}
		if b.err == nil {
			b.path = b.out
		}
	})
	return b.path, b.err
}

// BinaryDirEnv names the directory the built binaries are kept in between
// runs (default: latch-test-binaries in the user's cache directory, next
// to Go's own build cache). "off" builds into a temporary directory per
// process instead, removed by RemoveBinaries.
//
// Why keep them: go build relinks a binary on every call unless its -o
// file is already up to date (same build ID), and linking
// kube-controller-manager, kube-scheduler and the kubelet takes tens of
// seconds on two cores while the other test packages run. With one output
// path per checkout, component and flags, only the first test process of
// a run links; every later one (and every later run) finds the binary up
// to date. go build still checks every input, so an edited source is
// rebuilt as before.
const BinaryDirEnv = "LATCH_TEST_BINARIES"

// binaryDir is the directory builds go to, and whether it is this
// process's own temporary one.
func binaryDir() (dir string, temp bool, err error) {
	d := os.Getenv(BinaryDirEnv)
	if d == "" {
		if cache, cerr := os.UserCacheDir(); cerr == nil {
			d = filepath.Join(cache, "latch-test-binaries")
		}
	}
	if d != "" && d != "off" {
		if err := os.MkdirAll(d, 0o755); err == nil {
			return d, false, nil
		}
	}
	tmp, err := os.MkdirTemp("", "latch-bin")
	return tmp, true, err
}

// outputPath is one path per checkout (or upstream module directory),
// import path and flags under root: two checkouts, or two flag sets, never
// share a binary.
func outputPath(root, dir, importPath string, flags []string) (string, error) {
	where, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	if dir == "" {
		if where, err = moduleRoot(); err != nil {
			return "", err
		}
	}
	sum := sha256.Sum256([]byte(strings.Join(append([]string{where, importPath}, flags...), "\x00")))
	return filepath.Join(root, hex.EncodeToString(sum[:8]), path.Base(importPath)), nil
}

// moduleRoot is the directory of latch's go.mod in this checkout.
func moduleRoot() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("cannot locate latch's module root")
	}
	return filepath.Abs(filepath.Join(filepath.Dir(file), "..", ".."))
}

// lockOutput holds an exclusive lock on out's directory for one build:
// test packages run in parallel processes, and two go builds writing the
// same -o file at once would race.
func lockOutput(out string) (unlock func(), err error) {
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(out+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}

func buildSilently(dir string, importPaths []string, out string, flags []string) error {
	args := append([]string{"build"}, flags...)
	args = append(args, "-o", out)
	args = append(args, importPaths...)
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	if msg, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s (in %q): %v\n%s", strings.Join(args, " "), dir, err, msg)
	}
	return nil
}

// buildWithProgress is go build -v with progress lines on w; what go build
// printed besides package names (errors) goes into the error.
func buildWithProgress(w io.Writer, label, dir string, importPaths []string, out string, flags []string) error {
	where := "latch's module"
	if dir != "" {
		where = dir
		if rel, err := filepath.Rel(filepath.Join(upstreamRoot(), "..", ".."), dir); err == nil && !strings.HasPrefix(rel, "..") {
			where = rel
		}
	}
	names := make([]string, len(importPaths))
	for i, p := range importPaths {
		names[i] = path.Base(p)
	}
	what := fmt.Sprintf("building %s from %s", importPaths[0], where)
	if len(importPaths) > 1 {
		what = fmt.Sprintf("building %s together from %s, in one go build", strings.Join(names, ", "), where)
	}
	var msg bytes.Buffer
	b := buildprogress.Build{
		Label:       label,
		What:        what + " (a cold build takes minutes on two cores, later ones come from the Go build cache)",
		Dir:         dir,
		Flags:       flags,
		Output:      out,
		Packages:    importPaths,
		Mains:       importPaths,
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

// RemoveBinaries forgets what this process built, and deletes it when it
// went to a temporary directory (BinaryDirEnv "off", or no cache
// directory); binaries kept between runs stay for the next process.
func RemoveBinaries() {
	builds.mu.Lock()
	defer builds.mu.Unlock()
	if builds.dir != "" && builds.temp {
		os.RemoveAll(builds.dir)
	}
	builds.dir, builds.temp, builds.done = "", false, nil
}
