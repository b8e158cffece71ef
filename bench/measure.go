package bench

import (
	"context"
	"strings"
	"time"

	"github.com/latchcsi/latch/internal/csimock"
)

// snapshot is the state of every counter at one instant; two of them
// bracket a phase.
type snapshot struct {
	at          time.Time
	api         Writes // every client's writes, from the API server
	harness     Writes // the harness's own
	usage       map[string]Usage
	publishes   int64
	unpublishes int64
	duplicates  int64
}

func (e *env) snap(ctx context.Context, comps map[string]Component, d *csimock.Driver) (snapshot, error) {
	s := snapshot{at: time.Now(), harness: e.writes.snapshot(), usage: map[string]Usage{}}
	api, err := apiWrites(ctx, e.admin)
	if err != nil {
		return s, err
	}
	s.api = api
	for name, c := range comps {
		s.usage[name] = c.Usage()
	}
	if d != nil {
		st := d.Stats()
		s.publishes = st.Methods["ControllerPublishVolume"].Calls
		s.unpublishes = st.Methods["ControllerUnpublishVolume"].Calls
		s.duplicates = st.Publish.DuplicatePublishes
	}
	return s, nil
}

// snapEnd is the snapshot that ends a phase, taken once the API server
// has counted the phase's writes. The API server counts a request when its
// handler returns, which can be after the write's watch event reached the
// harness and ended the phase, so a snapshot taken at once can miss the
// phase's last writes (seen under load: 29 of a burst's 30 finalizer
// removals, the 30th counted a moment later). It reads the counters every
// writesCountedEvery until two readings agree on the components' writes,
// for at most writesCountedWithin; its time is the first reading's, when
// the phase was seen to end.
func (e *env) snapEnd(ctx context.Context, comps map[string]Component, d *csimock.Driver) (snapshot, error) {
	return steadySnapshot(ctx, func(ctx context.Context) (snapshot, error) { return e.snap(ctx, comps, d) },
		writesCountedEvery, writesCountedWithin)
}

const (
	writesCountedEvery  = 50 * time.Millisecond
	writesCountedWithin = 2 * time.Second
)

// steadySnapshot takes snapshots every until two in a row count the same
// component writes, or within has passed, and returns the last one with
// the first one's time.
func steadySnapshot(ctx context.Context, take func(context.Context) (snapshot, error), every, within time.Duration) (snapshot, error) {
	deadline := time.Now().Add(within)
	first, err := take(ctx)
	if err != nil {
		return first, err
	}
	prev := first
	for {
		select {
		case <-time.After(every):
		case <-ctx.Done():
			return prev, ctx.Err()
		}
		cur, err := take(ctx)
		if err != nil {
			return cur, err
		}
		if componentWrites(prev, cur).Total() == 0 || !time.Now().Before(deadline) {
			cur.at = first.at
			return cur, nil
		}
		prev = cur
	}
}

// settle waits until the components have made no API write for quiet (at
// most limit) and returns the snapshot that ends the quiet spell and how
// long the wait took. Past limit it returns the latest snapshot: whatever
// still writes then is not settling.
func (e *env) settle(ctx context.Context, comps map[string]Component, d *csimock.Driver, quiet, limit time.Duration) (snapshot, time.Duration, error) {
	start := time.Now()
	prev, err := e.snap(ctx, comps, d)
	if err != nil {
		return prev, 0, err
	}
	for {
		select {
		case <-time.After(quiet):
		case <-ctx.Done():
			return prev, time.Since(start), ctx.Err()
		}
		cur, err := e.snap(ctx, comps, d)
		if err != nil {
			return cur, time.Since(start), err
		}
		if componentWrites(prev, cur).Total() == 0 || time.Since(start) >= limit {
			return cur, time.Since(start), nil
		}
		prev = cur
	}
}

// componentWrites are the writes between a and b that the harness did not
// make, without the API server's own bookkeeping (it rewrites its lease
// and the default/kubernetes endpoints every few seconds; the components
// run without leader election and write neither).
func componentWrites(a, b snapshot) Writes {
	w := b.api.Sub(a.api).Sub(b.harness.Sub(a.harness))
	for k := range w {
		switch _, res, _ := strings.Cut(k, " "); res {
		case "leases", "endpoints", "endpointslices":
			delete(w, k)
		}
	}
	return w
}

// fillUsage sets the phase's CPU and RSS figures when the launcher measures
// them.
func (e *env) fillUsage(p *Phase, a, b snapshot) {
	if !e.cfg.Launcher.Measured() {
		return
	}
	p.CPUSeconds = map[string]float64{}
	p.PeakRSSBytes = map[string]uint64{}
	for name, ub := range b.usage {
		p.CPUSeconds[name] = ub.CPUSeconds - a.usage[name].CPUSeconds
		p.PeakRSSBytes[name] = ub.PeakRSSBytes
	}
}

// stopAll stops components and returns their final usage.
func stopAll(comps map[string]Component) (map[string]Usage, error) {
	out := map[string]Usage{}
	var first error
	for name, c := range comps {
		if err := c.Stop(); err != nil && first == nil {
			first = err
		}
		out[name] = c.Usage()
	}
	return out, first
}
