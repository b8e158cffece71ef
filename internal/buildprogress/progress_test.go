package buildprogress

import (
	"strings"
	"testing"
	"time"
)

func TestIsPackageLine(t *testing.T) {
	checkLines(t, "IsPackageLine", IsPackageLine, map[string]bool{
		"k8s.io/apiserver/pkg/server": true,
		"runtime":                     true,
		"github.com/latchcsi/latch/cmd/latch-local": true,
		"gopkg.in/inf.v0":                             true,
		"command-line-arguments":                      true,
		"":                                            false,
		"# github.com/latchcsi/latch/bench":           false,
		"bench/scale.go:194:14: e.x undefined":        false,
		"go: downloading k8s.io/api v0.36.3":          false,
		"package foo is not in std (/usr/lib/go/src)": false,
		"\tfoo.go:1: note":                            false,
	})
}

// checkLines checks that the line classifier f (named name) says want of
// each line.
func checkLines(t *testing.T, name string, f func(string) bool, lines map[string]bool) {
	t.Helper()
	for line, want := range lines {
		if got := f(line); got != want {
			t.Errorf("%s(%q) = %v, want %v", name, line, got, want)
		}
	}
}

// A cold build reports packages many times a second: lines come at most
// every Every, and while nothing is reported (a long compile or the link) a
// heartbeat comes every Heartbeat.
func TestProgressThrottlesAndBeats(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	p := &Progress{Label: "make demo", Mains: []string{"example.com/cmd/app"}}
	if got := p.Start(t0, "go build ./cmd/app"); got != "make demo: go build ./cmd/app" {
		t.Fatalf("Start = %q", got)
	}
	var lines []string
	// 100 packages in the first 9 s, one every 90 ms: one line at 5 s.
	for i := 0; i < 100; i++ {
		now := at(time.Duration(i) * 90 * time.Millisecond)
		if l, ok := p.Package(now, "example.com/p"+string(rune('a'+i%26))); ok {
			lines = append(lines, l)
		}
		if l, ok := p.Tick(now); ok {
			lines = append(lines, l)
		}
	}
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "make demo: [57 packages] compiling example.com/p") || !strings.HasSuffix(lines[0], ", 5s") {
		t.Fatalf("lines in the first 9 s = %q, want one at 5 s after 57 packages", lines)
	}
	// Packages counted since the last line: Tick prints once Every passed.
	if l, ok := p.Tick(at(10500 * time.Millisecond)); !ok || !strings.HasPrefix(l, "make demo: [100 packages]") {
		t.Fatalf("Tick at 10.5 s = %q, %v; want the count of 100", l, ok)
	}
	// The total once known, and the main package's link named.
	p.SetTotal(120)
	if l, ok := p.Package(at(11*time.Second), "example.com/cmd/app"); ok {
		t.Fatalf("Package 0.5 s after a line printed %q", l)
	}
	for s := 11; s <= 15; s++ {
		if l, ok := p.Tick(at(time.Duration(s) * time.Second)); ok {
			t.Fatalf("Tick at %ds printed %q, want nothing before 15.5 s", s, l)
		}
	}
	l, ok := p.Tick(at(16 * time.Second))
	if want := "make demo: [101/120 packages] compiling and linking example.com/cmd/app, 16s"; !ok || l != want {
		t.Fatalf("Tick at 16 s = %q, %v; want %q", l, ok, want)
	}
	// Nothing new (the link): silent until Heartbeat, then a heartbeat.
	if l, ok := p.Tick(at(24 * time.Second)); ok {
		t.Fatalf("Tick at 24 s printed %q although nothing changed since 16 s", l)
	}
	l, ok = p.Tick(at(25 * time.Second))
	if want := "make demo: [101/120 packages] compiling and linking example.com/cmd/app, 25s"; !ok || l != want {
		t.Fatalf("heartbeat at 25 s = %q, %v; want %q", l, ok, want)
	}
	if got, want := p.Done(at(30*time.Second), nil), "make demo: done in 30s (101 compiled, the rest from the Go build cache)"; got != want {
		t.Errorf("Done = %q, want %q", got, want)
	}
}

func TestProgressWarmAndFailed(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p := &Progress{Label: "kube-scheduler"}
	p.Start(t0, "building")
	if l, ok := p.Tick(t0.Add(9 * time.Second)); !ok || l != "kube-scheduler: [0 packages] checking the Go build cache / linking, 9s" {
		t.Errorf("heartbeat with nothing compiled = %q, %v", l, ok)
	}
	if got := p.Done(t0.Add(12*time.Second), nil); got != "kube-scheduler: done in 12s (no package to compile: all in the Go build cache)" {
		t.Errorf("Done warm = %q", got)
	}
	p.Package(t0.Add(13*time.Second), "example.com/broken")
	if got := p.Done(t0.Add(14*time.Second), errString("exit status 1")); got != "kube-scheduler: build failed after 14s (1 package compiled): exit status 1" {
		t.Errorf("Done failed = %q", got)
	}
}

type errString string

func (e errString) Error() string { return string(e) }

func TestResults(t *testing.T) {
	checkLines(t, "IsResultLine", IsResultLine, map[string]bool{
		"ok  \tgithub.com/latchcsi/latch/internal/csi\t1.2s":     true,
		"FAIL\tgithub.com/latchcsi/latch/test/e2e/x\t90.1s":      true,
		"?   \tgithub.com/latchcsi/latch/cmd/x\t[no test files]": true,
		"--- FAIL: TestX (0.00s)":                                false,
		"ok":                                                     false,
		"FAIL":                                                   false,
	})
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	r := &Results{Label: "make test", Total: 40}
	r.Start(t0)
	if l, ok := r.Tick(t0.Add(8 * time.Second)); ok {
		t.Fatalf("heartbeat after 8 s: %q", l)
	}
	if l, ok := r.Tick(t0.Add(9 * time.Second)); !ok || l != "make test: [0/40 packages reported] go test compiling and running, 9s" {
		t.Fatalf("heartbeat at 9 s = %q, %v", l, ok)
	}
	r.Line(t0.Add(12*time.Second), "ok  \tgithub.com/latchcsi/latch/internal/csi\t1.2s")
	r.Line(t0.Add(15*time.Second), "=== RUN TestX")
	if l, ok := r.Tick(t0.Add(23 * time.Second)); ok {
		t.Fatalf("heartbeat 8 s after output: %q", l)
	}
	if l, ok := r.Tick(t0.Add(24 * time.Second)); !ok || l != "make test: [1/40 packages reported] go test compiling and running, 24s" {
		t.Fatalf("heartbeat at 24 s = %q, %v", l, ok)
	}
}

// Ticked once a second as the runners do, a silent build (a long link)
// and a silent go test print a line at least every 10 s.
func TestNoSilenceLongerThanTenSecondsAtOneTickASecond(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p := &Progress{Label: "make demo"}
	p.Start(t0, "go build ./cmd/app")
	r := &Results{Label: "make test"}
	r.Start(t0)
	// Ticks land anywhere within a second: start them 0.999 s late.
	lastP, lastR := t0, t0
	for ms := 999; ms <= 120_000; ms += 1000 {
		now := t0.Add(time.Duration(ms) * time.Millisecond)
		if _, ok := p.Tick(now); ok {
			if gap := now.Sub(lastP); gap > 10*time.Second {
				t.Fatalf("build: %s without a line", gap)
			}
			lastP = now
		}
		if _, ok := r.Tick(now); ok {
			if gap := now.Sub(lastR); gap > 10*time.Second {
				t.Fatalf("go test: %s without a line", gap)
			}
			lastR = now
		}
	}
	if lastP.Before(t0.Add(110*time.Second)) || lastR.Before(t0.Add(110*time.Second)) {
		t.Fatalf("last lines at %s and %s of 120 s", lastP.Sub(t0), lastR.Sub(t0))
	}
}
