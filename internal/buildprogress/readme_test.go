package buildprogress

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The first lines of a cold `make demo` that README.md shows are the
// lines Progress prints for such a build: the start line, then a line
// once DefaultEvery has passed since the last one, at the package that
// arrives then.
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
	p.SetTotal(2190)
	pkg := func(at time.Duration, name string) {
		if l, ok := p.Package(t0.Add(at), name); ok {
			printed = append(printed, l)
		}
	}
	for i := range 11 {
		pkg(time.Duration(i)*100*time.Millisecond, "internal/p"+string(rune('a'+i)))
	}
	pkg(12*time.Second, "crypto/internal/fips140/sha256")
	pkg(13*time.Second, "crypto/internal/fips140/hmac")
	pkg(17*time.Second, "crypto/internal/fips140/subtle")
	if strings.Join(shown, "\n") != strings.Join(printed, "\n") {
		t.Errorf("README.md shows\n  %s\nProgress prints\n  %s", strings.Join(shown, "\n  "), strings.Join(printed, "\n  "))
	}
}
