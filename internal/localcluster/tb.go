package localcluster

import (
	"fmt"
	"os"
	"sync"
)

// serverTB satisfies the small testing.TB-like interface that
// kube-apiserver's in-process test server wants, so the server can run from a
// TestMain (before any *testing.T exists) and from the latch-local binary.
// Cleanups run when the API server is stopped; a Fatal aborts the start with an
// error instead of killing the process.
type serverTB struct {
	name string
	logf func(format string, args ...any)

	mu       sync.Mutex
	cleanups []func()
	failed   bool
	tmpDirs  []string
}

// fatalAbort is what Fatal panics with; startAPIServer recovers it.
type fatalAbort struct{ msg string }

var _ interface {
	Attr(key, value string)
	Chdir(dir string)
	Cleanup(func())
	Error(args ...any)
	Errorf(format string, args ...any)
	Fail()
	FailNow()
	Failed() bool
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Helper()
	Log(args ...any)
	Logf(format string, args ...any)
	Name() string
	Setenv(key, value string)
	Skip(args ...any)
	Skipf(format string, args ...any)
	SkipNow()
	Skipped() bool
	TempDir() string
} = (*serverTB)(nil)

func (t *serverTB) Attr(key, value string) {}
func (t *serverTB) Chdir(dir string)       {}
func (t *serverTB) Helper()                {}
func (t *serverTB) Name() string           { return t.name }
func (t *serverTB) Skipped() bool          { return false }
func (t *serverTB) Setenv(key, value string) {
	// The API server's test harness does not need environment changes;
	// refusing keeps a long-running process from mutating its own env.
	t.Logf("ignoring Setenv(%q)", key)
}

func (t *serverTB) Cleanup(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cleanups = append(t.cleanups, f)
}

// runCleanups runs registered cleanups last-in first-out, like testing.T.
func (t *serverTB) runCleanups() {
	for {
		t.mu.Lock()
		n := len(t.cleanups)
		if n == 0 {
			dirs := t.tmpDirs
			t.tmpDirs = nil
			t.mu.Unlock()
			for _, d := range dirs {
				os.RemoveAll(d)
			}
			return
		}
		f := t.cleanups[n-1]
		t.cleanups = t.cleanups[:n-1]
		t.mu.Unlock()
		f()
	}
}

func (t *serverTB) Log(args ...any) { t.Logf("%s", fmt.Sprint(args...)) }
func (t *serverTB) Logf(format string, args ...any) {
	if t.logf != nil {
		t.logf(format, args...)
	}
}

func (t *serverTB) Error(args ...any) { t.Log(args...); t.Fail() }
func (t *serverTB) Errorf(format string, args ...any) {
	t.Logf(format, args...)
	t.Fail()
}

func (t *serverTB) Fail() {
	t.mu.Lock()
	t.failed = true
	t.mu.Unlock()
}

func (t *serverTB) Failed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.failed
}

func (t *serverTB) FailNow() { t.Fail(); panic(fatalAbort{msg: "FailNow"}) }
func (t *serverTB) Fatal(args ...any) {
	t.Fail()
	panic(fatalAbort{msg: fmt.Sprint(args...)})
}
func (t *serverTB) Fatalf(format string, args ...any) {
	t.Fail()
	panic(fatalAbort{msg: fmt.Sprintf(format, args...)})
}
func (t *serverTB) Skip(args ...any)                 { t.Fatal(append([]any{"skip: "}, args...)...) }
func (t *serverTB) Skipf(format string, args ...any) { t.Fatalf("skip: "+format, args...) }
func (t *serverTB) SkipNow()                         { t.Fatal("skip") }

func (t *serverTB) TempDir() string {
	d, err := os.MkdirTemp("", "latch-apiserver-")
	if err != nil {
		t.Fatalf("create temp dir: %v", err)
	}
	t.mu.Lock()
	t.tmpDirs = append(t.tmpDirs, d)
	t.mu.Unlock()
	return d
}
