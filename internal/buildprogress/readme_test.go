package buildprogress

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The lines of a cold `make demo` that README.md shows (taken from a run)
// are the lines Progress prints for such a build: the start line, then a
// line once DefaultEvery has passed since the last one, at the package
// that arrives then, and the main package's "compiling and linking".
func TestREADMEShowsTheLinesProgressPrints(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var shown []string
	for _, l := range strings.Split(string(readme), "\n") {
		if strings.HasPrefix(l, "make demo: ") {
			shown = append(shown, l)
		}
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p := &Progress{Label: "make demo", Mains: []string{"github.com/latchcsi/latch/cmd/latch-local"}}
	printed := []string{p.Start(t0, "go build ./cmd/latch-local")}
	p.SetTotal(2233)
	pkg := func(at time.Duration, name string) {
		if l, ok := p.Package(t0.Add(at), name); ok {
			printed = append(printed, l)
		}
	}
	// 53 packages in the first 5 s, html/template the 54th at 5 s, 48 more
	// before crypto/sha1 at 10 s, then the rest within a second of it, and
	// latch-local's main package (the 2,162nd) at 6m24s.
	for i := range 53 {
		pkg(time.Duration(i)*80*time.Millisecond, fmt.Sprintf("internal/p%d", i))
	}
	pkg(5*time.Second, "html/template")
	for i := range 48 {
		pkg(5*time.Second+time.Duration(i)*90*time.Millisecond, fmt.Sprintf("internal/q%d", i))
	}
	pkg(10*time.Second, "crypto/sha1")
	for i := range 2162 - 104 {
		pkg(10*time.Second+time.Duration(i)*400*time.Microsecond, fmt.Sprintf("internal/r%d", i))
	}
	pkg(6*time.Minute+24*time.Second, "github.com/latchcsi/latch/cmd/latch-local")
	if strings.Join(shown, "\n") != strings.Join(printed, "\n") {
		t.Errorf("README.md shows\n  %s\nProgress prints\n  %s", strings.Join(shown, "\n  "), strings.Join(printed, "\n  "))
	}
}
