package app

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/clock"
	testingclock "k8s.io/utils/clock/testing"
)

// slowAPI makes every Lease request take latency of a fake clock, and
// tells when the process under test waits on that clock (quiet), and
// until when: inside a request, or for its next renewal (the After the
// renew loop asks the clock for). The test moves the clock only then, to
// exactly that time, so what it asserts does not depend on how fast the
// machine runs the goroutines in between.
type slowAPI struct {
	fc      *testingclock.FakeClock
	latency time.Duration
	slow    atomic.Bool
	calls   atomic.Int64

	mu    sync.Mutex
	quiet bool
	next  time.Time
}

// wait is the fault of every Lease request: latency on the fake clock.
func (s *slowAPI) wait(ctx context.Context) error {
	if !s.slow.Load() {
		return nil
	}
	s.calls.Add(1)
	s.mu.Lock()
	done := s.fc.After(s.latency)
	s.next, s.quiet = s.fc.Now().Add(s.latency), true
	s.mu.Unlock()
	select {
	case <-done:
	case <-ctx.Done():
		return ctx.Err()
	}
	s.mu.Lock()
	s.quiet = false
	s.mu.Unlock()
	return nil
}

// After is the presence's clock's After: the renew loop waiting for its
// next renewal.
func (s *slowAPI) After(d time.Duration) <-chan time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next, s.quiet = s.fc.Now().Add(d), true
	return s.fc.After(d)
}

// slowClock is the fake clock with After reported to slowAPI.
type slowClock struct {
	*testingclock.FakeClock
	api *slowAPI
}

func (c slowClock) After(d time.Duration) <-chan time.Time { return c.api.After(d) }

var _ clock.Clock = slowClock{}

// An API server busy with a burst of writes (the test process's own, or a
// real one's at the end of a long queue) answers every Lease request in
// 3 s. With the binary's Lease timings (lease duration 15 s, renew
// deadline 10 s, renewals every 5 s) a renewal has 5 s: the renewal after
// the last one that found the Lease ours is sent 5 s after that one was,
// and the deadline is 10 s after it. The attacher must keep its Lease and
// work on.
//
// Before, a renewal was a read and a write (6 s), and the next one was
// sent 5 s after the last one returned, so the second renewal had 10 − 5
// − 6 s: the attacher stopped at the renew deadline (15 s in) with every
// request answered, and the e2e burst test failed under load with "the
// renewal in flight had not returned". Now a renewal of a Lease this
// process holds is one write (an update of the Lease as last written,
// guarded by its resourceVersion), and renewals are sent every 5 s from
// when the last was sent. Seen failing without either change.
func TestPresenceKeepsItsLeaseWhileEachLeaseRequestTakesThreeSeconds(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	fc := testingclock.NewFakeClock(time.Now())
	api := &slowAPI{fc: fc, latency: 3 * time.Second}
	client := leaseAPI()
	cfg := presenceConfig("a", &testGauge{})
	cfg.LeaseDuration, cfg.RenewDeadline, cfg.RetryPeriod = 15*time.Second, 10*time.Second, 5*time.Second
	cfg.Presence.Clock = slowClock{fc, api}

	w := runTimedWork(ctx, leaseFaults{client, api.wait}, cfg, fc.Now, func() { api.slow.Store(true) })
	stoppedAt, result := &w.stoppedAt, w.result
	t0 := within(t, w.started, "presence never started the work")

	const run = time.Minute
	for fc.Since(t0) < run && stoppedAt.Load() == nil {
		var next time.Time
		waitUntil(t, ctx, "the attacher waiting on the clock (in a Lease request or for its next renewal)", func() bool {
			api.mu.Lock()
			defer api.mu.Unlock()
			if stoppedAt.Load() != nil {
				return true
			}
			if api.quiet {
				next, api.quiet = api.next, false
				return true
			}
			return false
		})
		if stoppedAt.Load() == nil {
			fc.SetTime(next)
		}
	}
	if at := stoppedAt.Load(); at != nil {
		t.Fatalf("the work stopped %s after it started, with every Lease request answered in %s (%d requests): the renew deadline passed between two renewals that each returned in time",
			at.Sub(t0), api.latency, api.calls.Load())
	}
	// One request per renewal: a renewal every 5 s for a minute.
	if n := api.calls.Load(); n > int64(run/cfg.RetryPeriod)+1 {
		t.Errorf("%d Lease requests in %s of renewals every %s: want one per renewal (the update of the Lease as last written), not a read before each write", n, run, cfg.RetryPeriod)
	}
	l, err := client.CoordinationV1().Leases("default").Get(ctx, "test-lease", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := ptrValue(l.Spec.HolderIdentity); h != "a" || l.Spec.RenewTime == nil || fc.Since(l.Spec.RenewTime.Time) > cfg.RenewDeadline {
		t.Errorf("Lease after %s: holder %q, renewed at %v (now %v); want held by a and renewed within the renew deadline", run, h, l.Spec.RenewTime, fc.Now())
	}
	// Stop: the renewal in flight, if any, ends when the clock reaches
	// its answer; the release is not slowed down.
	api.slow.Store(false)
	stop()
	for range 1000 {
		select {
		case <-result:
			return
		case <-time.After(10 * time.Millisecond):
			fc.Step(time.Second)
		}
	}
	t.Fatal("RunAsLeader did not return after its context ended")
}

func ptrValue(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}
