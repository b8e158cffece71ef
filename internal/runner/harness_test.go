package runner

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/latchcsi/latch/internal/testsupport/fakeclock"
)

// call is one Reconcile invocation as the reconciler saw it.
type call struct {
	key string
	at  time.Time // fake clock time during the call
}

// harness runs a Runner[string] on a fake clock. Tests wait for passes
// through the afterPass hook, never for wall-clock time; the only real
// waits are short "nothing happens" checks, which cannot flake into a
// failure.
type harness struct {
	t      *testing.T
	clock  *testingclock.FakeClock
	runner *Runner[string]
	calls  chan call
	passes chan string
	cancel context.CancelFunc
	runErr chan error
	// idleWaiters is how many timers the runner holds on the fake clock
	// with no retry scheduled.
	idleWaiters int
}

// waitArmed waits until the delaying queue has armed a timer for a
// retry.
func (h *harness) waitArmed() {
	h.t.Helper()
	fakeclock.WaitArmed(h.t, h.clock, h.idleWaiters)
}

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// startHarness starts a runner whose reconciler records each call and then
// delegates to fn.
func startHarness(t *testing.T, opts Options, fn func(ctx context.Context, key string, n int) (Result, error)) *harness {
	t.Helper()
	h := &harness{
		t:      t,
		clock:  testingclock.NewFakeClock(t0),
		calls:  make(chan call, 100),
		passes: make(chan string, 100),
		runErr: make(chan error, 1),
	}
	opts.Clock = h.clock
	if opts.Name == "" {
		opts.Name = strings.ReplaceAll(t.Name(), "/", "_")
	}
	var mu sync.Mutex
	counts := map[string]int{}
	rec := ReconcilerFunc[string](func(ctx context.Context, key string) (Result, error) {
		mu.Lock()
		counts[key]++
		n := counts[key]
		mu.Unlock()
		h.calls <- call{key: key, at: h.clock.Now()}
		return fn(ctx, key, n)
	})
	h.runner = New[string](rec, opts)
	h.runner.afterPass = func(key string) { h.passes <- key }
	// The queue's own tickers, present while nothing waits for a retry.
	h.idleWaiters = fakeclock.SettledWaiters(h.clock)

	_, ctx := ktesting.NewTestContext(t)
	ctx, h.cancel = context.WithCancel(ctx)
	go func() { h.runErr <- h.runner.Run(ctx) }()
	t.Cleanup(func() {
		h.cancel()
		select {
		case <-h.runErr:
		case <-time.After(10 * time.Second):
			t.Error("runner did not stop")
		}
	})
	return h
}

// expectCall waits for the next Reconcile call and checks key and fake time.
func (h *harness) expectCall(key string, at time.Time) {
	h.t.Helper()
	select {
	case c := <-h.calls:
		if c.key != key || !c.at.Equal(at) {
			h.t.Fatalf("reconcile of %q at +%v, want %q at +%v", c.key, c.at.Sub(t0), key, at.Sub(t0))
		}
	case <-time.After(10 * time.Second):
		h.t.Fatalf("no reconcile of %q at +%v", key, at.Sub(t0))
	}
}

// waitPass waits until the runner has finished handling a pass for key
// (requeue decided, Done called).
func (h *harness) waitPass(key string) {
	h.t.Helper()
	select {
	case k := <-h.passes:
		if k != key {
			h.t.Fatalf("pass finished for %q, want %q", k, key)
		}
	case <-time.After(10 * time.Second):
		h.t.Fatalf("pass for %q did not finish", key)
	}
}

func (h *harness) expectNoCall() {
	h.t.Helper()
	select {
	case c := <-h.calls:
		h.t.Fatalf("unexpected reconcile of %q at +%v", c.key, c.at.Sub(t0))
	case <-time.After(50 * time.Millisecond):
	}
}

// expectRetryAt checks that the key is not processed just before at and is
// processed exactly at at.
func (h *harness) expectRetryAt(key string, at time.Time) {
	h.t.Helper()
	h.waitArmed()
	h.clock.SetTime(at.Add(-time.Nanosecond))
	h.expectNoCall()
	h.clock.SetTime(at)
	h.expectCall(key, at)
	h.waitPass(key)
}

var errBoom = errors.New("boom")

func alwaysFail(context.Context, string, int) (Result, error) { return Result{}, errBoom }
