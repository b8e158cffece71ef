package buildprogress

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"time"
)

// Results follows go test's output: it counts the packages whose result
// line ("ok", "FAIL", "?") appeared, and while nothing is printed (go test
// compiles and links test binaries, or a long package runs) it returns a
// heartbeat line at most every Heartbeat. Like Progress it reads no clock.
type Results struct {
	Label     string
	Heartbeat time.Duration // DefaultHeartbeat if zero
	Total     int           // packages go test runs (0 = unknown)

	start, lastOut time.Time
	reported       int
}

// Start records the start of the run.
func (r *Results) Start(now time.Time) { r.start, r.lastOut = now, now }

// IsResultLine reports whether a line of go test's standard output is a
// package's result (not a test's output).
func IsResultLine(line string) bool {
	return strings.HasPrefix(line, "ok  \t") || strings.HasPrefix(line, "FAIL\t") || strings.HasPrefix(line, "?   \t")
}

// Line records a line go test printed: any line ends a silence.
func (r *Results) Line(now time.Time, line string) {
	r.lastOut = now
	if IsResultLine(line) {
		r.reported++
	}
}

// Tick returns a heartbeat if go test has printed nothing for Heartbeat.
func (r *Results) Tick(now time.Time) (string, bool) {
	hb := r.Heartbeat
	if hb <= 0 {
		hb = DefaultHeartbeat
	}
	if now.Sub(r.lastOut) < hb {
		return "", false
	}
	r.lastOut = now
	count := fmt.Sprintf("%d packages", r.reported)
	if r.Total > 0 {
		count = fmt.Sprintf("%d/%d packages", r.reported, r.Total)
	}
	return fmt.Sprintf("%s: [%s reported] go test compiling and running, %s", r.Label, count, now.Sub(r.start).Round(time.Second)), true
}

// RunTest runs argv (a go test command line), copies its standard output line by line
// to stdout unchanged (the summary lines CI reads), lets its standard error
// through to stderr, and writes heartbeats to stderr. The package total is
// go list's count of pkgs (the patterns go test runs).
func RunTest(ctx context.Context, label string, argv, pkgs []string, stdout, stderr io.Writer) error {
	r := &Results{Label: label}
	r.Start(time.Now())
	if total, err := exec.CommandContext(ctx, "go", append([]string{"list"}, pkgs...)...).Output(); err == nil {
		r.Total = strings.Count(string(total), "\n")
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stderr = stderr
	interruptOnCancel(cmd)
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	err = follow(cmd, pipe, func(l string) {
		_, _ = io.WriteString(stdout, l)
		r.Line(time.Now(), strings.TrimSuffix(l, "\n"))
	}, func() {
		if hb, ok := r.Tick(time.Now()); ok {
			fmt.Fprintln(stderr, hb)
		}
	})
	if err != nil {
		return fmt.Errorf("%s: %w", strings.Join(argv, " "), err)
	}
	return nil
}
