package bench

import (
	"context"
	"time"
)

// A mark is what a measured window of the scale run starts or ends with:
// the time, the controller's CPU and Go collections so far, the API
// server's requests (all verbs, every client) and the controller's writes
// (writeSnapshot).
type mark struct {
	at     time.Time
	usage  Usage
	gc     gcTally
	reqs   int
	writes Writes
}

// mark reads the counters a window is measured by; extra's writes are
// not the controller's (writeSnapshot).
func (e *scaleEnv) mark(ctx context.Context, p *scaleProc, extra *writeCounter) (mark, error) {
	reqs, err := apiRequests(ctx, e.admin)
	if err != nil {
		return mark{}, err
	}
	writes, err := e.writeSnapshot(ctx, extra)
	if err != nil {
		return mark{}, err
	}
	return mark{at: time.Now(), usage: p.usage(), gc: p.gc(), reqs: reqs, writes: writes}, nil
}

// window is what happened between two marks.
type window struct{ from, to mark }

func (w window) seconds() float64 { return w.to.at.Sub(w.from.at).Seconds() }

// cpuPercent is the controller's CPU over the window, in % of one core.
func (w window) cpuPercent() float64 {
	return round2(100 * (w.to.usage.CPUSeconds - w.from.usage.CPUSeconds) / w.seconds())
}

// gc is the controller's collections during the window.
func (w window) gc() gcTally { return w.to.gc.Sub(w.from.gc) }

// perMinute is n over the window, per minute.
func (w window) perMinute(n int) float64 { return round2(float64(n) * 60 / w.seconds()) }

// requestsPerMinute is the API server's request rate over the window.
func (w window) requestsPerMinute() float64 { return w.perMinute(w.to.reqs - w.from.reqs) }

// writes is the controller's writes during the window, by kind.
func (w window) writes() Writes { return w.to.writes.Sub(w.from.writes) }
