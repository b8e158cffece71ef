// Package buildprogress turns the output of `go build -v` into a few
// progress lines ("[n/N packages] compiling <pkg>, 1m05s"), so a cold build
// that takes tens of minutes is never silent for long. It uses only the
// standard library: the program that runs it (hack/buildprogress) compiles
// in seconds even on an empty Go build cache.
package buildprogress

import (
	"fmt"
	"strings"
	"time"
)

// Defaults of Progress's intervals. The runners tick once a second, so a
// heartbeat of 9 s means a line at most 10 s after the last one, the most
// a newcomer's first run may stay silent.
const (
	DefaultEvery     = 5 * time.Second
	DefaultHeartbeat = 9 * time.Second
)

// Progress counts the packages a go build -v run reports and decides when
// to print a line. It does no I/O and reads no clock: callers pass the
// time, so the throttling is tested without sleeping.
type Progress struct {
	// Label starts every line (e.g. "make demo" or "kube-scheduler").
	Label string
	// Every is the least time between two lines that report new packages
	// (DefaultEvery if zero).
	Every time.Duration
	// Heartbeat is the longest time without a line while the build runs
	// (DefaultHeartbeat if zero): a line is printed even if nothing changed.
	Heartbeat time.Duration
	// Mains are the main packages being built: once go build reports one
	// of them, its link follows (go build -v prints nothing while linking).
	Mains []string

	start     time.Time
	lastPrint time.Time
	total     int // 0 while unknown
	done      int
	printed   int // done at the last printed line
	last      string
}

// Start records the start of the build and returns the first line.
func (p *Progress) Start(now time.Time, what string) string {
	p.start, p.lastPrint = now, now
	return fmt.Sprintf("%s: %s", p.Label, what)
}

// SetTotal sets the number of packages the build can compile (go list
// -deps); until it is known lines show the count alone.
func (p *Progress) SetTotal(n int) { p.total = n }

// IsPackageLine reports whether a line of go build -v's output names a
// package being built. Everything else (compile errors "file.go:1:2: ...",
// "# pkg" headers, "go: downloading ...") must be shown as it is.
func IsPackageLine(line string) bool {
	if line == "" {
		return false
	}
	for _, r := range line {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		case strings.ContainsRune("._~+-/", r):
		default:
			return false
		}
	}
	return true
}

// Package counts a package go build -v reported and returns a line to
// print if one is due (at most one every Every).
func (p *Progress) Package(now time.Time, pkg string) (string, bool) {
	p.done++
	p.last = pkg
	if now.Sub(p.lastPrint) < p.every() {
		return "", false
	}
	return p.line(now), true
}

// Tick returns a line if the build has been silent for Heartbeat, or if
// packages were counted since the last line and Every has passed. Call it
// about once a second while the build runs.
func (p *Progress) Tick(now time.Time) (string, bool) {
	since := now.Sub(p.lastPrint)
	if since >= p.heartbeat() || (p.done != p.printed && since >= p.every()) {
		return p.line(now), true
	}
	return "", false
}

// Done returns the closing line: how many packages were compiled in how
// long, or the failure.
func (p *Progress) Done(now time.Time, err error) string {
	elapsed := p.elapsed(now)
	if err != nil {
		return fmt.Sprintf("%s: build failed after %s (%s compiled): %v", p.Label, elapsed, packages(p.done), err)
	}
	if p.done == 0 {
		return fmt.Sprintf("%s: done in %s (no package to compile: all in the Go build cache)", p.Label, elapsed)
	}
	return fmt.Sprintf("%s: done in %s (%d compiled, the rest from the Go build cache)", p.Label, elapsed, p.done)
}

func (p *Progress) line(now time.Time) string {
	p.lastPrint, p.printed = now, p.done
	count := packages(p.done)
	if p.total > 0 {
		count = fmt.Sprintf("%d/%d packages", min(p.done, p.total), p.total)
	}
	phase := "checking the Go build cache / linking"
	switch {
	case p.last != "" && p.isMain(p.last):
		phase = "compiling and linking " + p.last
	case p.last != "":
		phase = "compiling " + p.last
	}
	return fmt.Sprintf("%s: [%s] %s, %s", p.Label, count, phase, p.elapsed(now))
}

func packages(n int) string {
	if n == 1 {
		return "1 package"
	}
	return fmt.Sprintf("%d packages", n)
}

func (p *Progress) isMain(pkg string) bool {
	for _, m := range p.Mains {
		if m == pkg {
			return true
		}
	}
	return false
}

func (p *Progress) elapsed(now time.Time) time.Duration {
	return now.Sub(p.start).Round(time.Second)
}

func (p *Progress) every() time.Duration {
	if p.Every > 0 {
		return p.Every
	}
	return DefaultEvery
}

func (p *Progress) heartbeat() time.Duration {
	if p.Heartbeat > 0 {
		return p.Heartbeat
	}
	return DefaultHeartbeat
}
