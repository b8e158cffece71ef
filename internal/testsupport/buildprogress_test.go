package testsupport

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/latchcsi/latch/internal/testsupport/gomodule"
)

// writeModule writes a one-package module (stdlib only) and returns its
// directory.
func writeModule(t *testing.T, main string) string {
	t.Helper()
	return gomodule.Write(t, "example.com/tiny", map[string]string{"main.go": main})
}

// latch-local sets a progress writer: a build says what it builds and
// from where, and how it ended; without one a build prints nothing.
func TestBuildProgressSaysWhatIsBuilt(t *testing.T) {
	isolateBinaries(t)
	var progress bytes.Buffer
	SetBuildProgress(&progress)
	defer SetBuildProgress(nil)
	dir := writeModule(t, "package main\n\nfunc main() {}\n")
	p, err := buildOnce(dir, "example.com/tiny")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("built binary: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(progress.String()), "\n")
	if want := "tiny: building example.com/tiny from " + dir + " (a cold build takes minutes on two cores"; !strings.HasPrefix(lines[0], want) {
		t.Errorf("first line %q, want it to start with %q", lines[0], want)
	}
	if !strings.HasPrefix(lines[len(lines)-1], "tiny: done in ") {
		t.Errorf("last line %q, want the result", lines[len(lines)-1])
	}

	SetBuildProgress(nil)
	progress.Reset()
	if _, err := buildOnce(writeModule(t, "package main\n\nfunc main() { println() }\n"), "example.com/tiny"); err != nil {
		t.Fatal(err)
	}
	if progress.Len() != 0 {
		t.Errorf("a build without a progress writer printed %q", progress.String())
	}
}

// A failed build's error carries go's compile error (not only the progress
// output), as the silent build's does.
func TestBuildProgressErrorCarriesGoOutput(t *testing.T) {
	isolateBinaries(t)
	var progress bytes.Buffer
	SetBuildProgress(&progress)
	defer SetBuildProgress(nil)
	_, err := buildOnce(writeModule(t, "package main\n\nfunc main() { undefinedThing() }\n"), "example.com/tiny")
	if err == nil || !strings.Contains(err.Error(), "undefinedThing") || !strings.Contains(err.Error(), "go build -v -o ") {
		t.Fatalf("error = %v, want the go build command and its compile error", err)
	}
	if !strings.Contains(progress.String(), "tiny: build failed after ") {
		t.Errorf("progress %q lacks the failure", progress.String())
	}
}
