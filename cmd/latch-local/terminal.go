package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"golang.org/x/term"

	"github.com/latchcsi/latch/internal/latchlocal"
)

// terminal renders demo progress: one aligned line per milestone, a
// "waiting for" line that is overwritten on a TTY, colour only on a TTY.
type terminal struct {
	w       io.Writer
	tty     bool
	color   bool
	quiet   bool // json output: progress goes to stderr-free silence
	waiting bool
}

func newTerminal(w io.Writer, noColor, quiet bool) *terminal {
	tty := false
	if f, ok := w.(*os.File); ok {
		tty = term.IsTerminal(int(f.Fd()))
	}
	return &terminal{w: w, tty: tty, color: tty && !noColor && os.Getenv("NO_COLOR") == "", quiet: quiet}
}

func (t *terminal) paint(code, s string) string {
	if !t.color {
		return s
	}
	return "\x1b[" + code + "m" + s + "\x1b[0m"
}

func (t *terminal) clearWaiting() {
	if t.waiting && t.tty {
		fmt.Fprint(t.w, "\r\x1b[K")
	}
	t.waiting = false
}

func (t *terminal) info(format string, args ...any) {
	if t.quiet {
		return
	}
	t.clearWaiting()
	fmt.Fprintln(t.w, t.paint("2", "» ")+fmt.Sprintf(format, args...))
}

func (t *terminal) Phase(name string) {
	if t.quiet {
		return
	}
	t.clearWaiting()
	fmt.Fprintf(t.w, "\n%s\n", t.paint("1", strings.ToUpper(name)))
}

func (t *terminal) Waiting(step string) {
	if t.quiet || !t.tty {
		return
	}
	t.clearWaiting()
	fmt.Fprintf(t.w, "  %s %s", t.paint("33", "…"), "waiting: "+step)
	t.waiting = true
}

func (t *terminal) Step(s latchlocal.Step) {
	if t.quiet {
		return
	}
	t.clearWaiting()
	fmt.Fprintf(t.w, "  %s %9s  %-52s %s\n", t.paint("32", "✓"), fmtDur(s.At), s.Name, t.paint("2", s.Detail))
}

func (t *terminal) summary(r latchlocal.Result) {
	t.clearWaiting()
	fmt.Fprintf(t.w, "\n%s\n", t.paint("1", "SUMMARY"))
	tw := tabwriter.NewWriter(t.w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  PHASE\tSTEP\tSINCE PHASE START")
	for _, s := range r.Steps {
		fmt.Fprintf(tw, "  %s\t%s\t%8s\n", s.Phase, s.Name, fmtDur(s.Latency))
	}
	tw.Flush()
	if r.OK {
		fmt.Fprintln(t.w, "\n"+t.paint("32", "Demo finished: every step happened in order."))
	} else {
		fmt.Fprintln(t.w, "\n"+t.paint("31", "Demo failed at: "+r.FailedStep+": "+r.Error))
	}
}

func fmtDur(d time.Duration) string {
	return fmt.Sprintf("+%.3fs", d.Seconds())
}
