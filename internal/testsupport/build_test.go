package testsupport

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"github.com/latchcsi/latch/internal/testsupport/gomodule"
)

func TestBinaryBuildsOncePerProcess(t *testing.T) {
	isolateBinaries(t)
	p1, err := Binary("cmd/csi-mock-driver")
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(p1)
	if err != nil || st.Mode()&0o111 == 0 {
		t.Fatalf("built binary %s: %v %v", p1, st, err)
	}
	p2, err := Binary("cmd/csi-mock-driver")
	if err != nil || p2 != p1 {
		t.Errorf("second Binary = %s %v, want the same %s", p2, err, p1)
	}
	if _, err := Binary("cmd/no-such-command"); err == nil {
		t.Error("building a missing package succeeded")
	}
}

type fatalRecorder struct{ msg string }

func (f *fatalRecorder) Helper()                           {}
func (f *fatalRecorder) Fatalf(format string, args ...any) { f.msg = fmt.Sprintf(format, args...) }

// isolateBinaries makes the test's builds go to a directory of its own.
func isolateBinaries(t *testing.T) string {
	t.Helper()
	RemoveBinaries()
	dir := t.TempDir()
	t.Setenv(BinaryDirEnv, dir)
	t.Cleanup(RemoveBinaries)
	return dir
}

// A binary is kept between processes (RemoveBinaries forgets it, as a new
// test process would not know it): the next build of the same module,
// import path and flags finds it up to date and does not relink it; other
// flags get a binary of their own.
func TestBinaryKeptBetweenProcessesIsNotRelinked(t *testing.T) {
	root := isolateBinaries(t)
	mod := writeModule(t, "package main\n\nfunc main() {}\n")
	p1, err := buildOnce(mod, "example.com/tiny")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(p1, root+string(os.PathSeparator)) {
		t.Fatalf("binary at %s, want it under %s (%s)", p1, root, BinaryDirEnv)
	}
	before, err := os.Stat(p1)
	if err != nil {
		t.Fatal(err)
	}
	RemoveBinaries()
	if _, err := os.Stat(p1); err != nil {
		t.Fatalf("RemoveBinaries deleted a kept binary: %v", err)
	}
	p2, err := buildOnce(mod, "example.com/tiny")
	if err != nil || p2 != p1 {
		t.Fatalf("second process's build = %s %v, want %s", p2, err, p1)
	}
	after, err := os.Stat(p2)
	if err != nil {
		t.Fatal(err)
	}
	// A relink writes a new file (go build removes the old one, or renames
	// the new one over it); an up-to-date binary keeps its file (go build
	// only touches its times).
	if !os.SameFile(before, after) {
		t.Errorf("binary relinked: file %v before, %v after", before.Sys(), after.Sys())
	}
	p3, err := buildOnce(mod, "example.com/tiny", "-trimpath")
	if err != nil || p3 == p1 {
		t.Errorf("build with other flags = %s %v, want a binary of its own (not %s)", p3, err, p1)
	}
}

// With BinaryDirEnv "off" a process builds into a temporary directory
// that RemoveBinaries deletes.
func TestBinaryDirOffIsTemporary(t *testing.T) {
	RemoveBinaries()
	t.Setenv(BinaryDirEnv, "off")
	t.Cleanup(RemoveBinaries)
	p, err := buildOnce(writeModule(t, "package main\n\nfunc main() {}\n"), "example.com/tiny")
	if err != nil {
		t.Fatal(err)
	}
	RemoveBinaries()
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Errorf("binary %s still there after RemoveBinaries: %v", p, err)
	}
}

// Several main packages built together: one go build into one directory,
// a binary per package named as go names it, each runnable; kept between
// processes like a single binary (not relinked).
func TestBuildTogetherBuildsEveryMainIntoOneDirectory(t *testing.T) {
	root := isolateBinaries(t)
	mod := gomodule.Write(t, "example.com/two", map[string]string{
		"one/main.go": "package main\n\nfunc main() { println(\"one\") }\n",
		"two/main.go": "package main\n\nfunc main() { println(\"two\") }\n",
	})
	paths := []string{"example.com/two/one", "example.com/two/two"}
	var progress bytes.Buffer
	SetBuildProgress(&progress)
	defer SetBuildProgress(nil)
	bins, err := buildTogether("one+two", mod, paths)
	if err != nil {
		t.Fatal(err)
	}
	SetBuildProgress(nil)
	if want := "one+two: building one, two together from " + mod + ", in one go build ("; !strings.HasPrefix(progress.String(), want) {
		t.Errorf("progress %q, want it to start with %q", progress.String(), want)
	}
	if len(bins) != 2 || filepath.Dir(bins[paths[0]]) != filepath.Dir(bins[paths[1]]) || !strings.HasPrefix(bins[paths[0]], root+string(os.PathSeparator)) {
		t.Fatalf("binaries %v, want two in one directory under %s", bins, root)
	}
	for _, p := range paths {
		out, err := exec.Command(bins[p]).CombinedOutput()
		if want := path.Base(p) + "\n"; err != nil || string(out) != want {
			t.Errorf("%s printed %q (%v), want %q", bins[p], out, err, want)
		}
	}
	before, err := os.Stat(bins[paths[0]])
	if err != nil {
		t.Fatal(err)
	}
	RemoveBinaries()
	again, err := buildTogether("one+two", mod, paths)
	if err != nil || again[paths[0]] != bins[paths[0]] {
		t.Fatalf("second process's build = %v %v, want %v", again, err, bins)
	}
	after, err := os.Stat(again[paths[0]])
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(before, after) {
		t.Errorf("binary relinked: file %v before, %v after", before.Sys(), after.Sys())
	}
}
