package app

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"
)

// Presence mode (no --leader-election), the Lease renewals start failing
// while the attacher works: the work must stop at the renew deadline,
// counted from the last renewal that found the Lease ours, whatever the
// renewal does. Another replica takes the Lease over one lease duration
// after the last renewal it saw; working past that is two active
// attachers of one driver. Before, a renewal that hung was bounded only
// by its own timeout (the renew deadline, from when it was sent), so the
// work stopped at retry period + renew deadline after the last renewal
// (the whole lease duration with the defaults); and renewals that failed
// fast were checked only every retry period, so the work stopped at the
// first retry past the deadline. The clock is a fake one: the assertion
// is on the order of the renew deadline, the stop and the lease expiry,
// not on how fast anything runs.
func TestPresenceStopsWorkingAtTheRenewDeadlineWhenRenewalsHangOrFail(t *testing.T) {
	for _, mode := range []string{"hang", "error"} {
		for i := range 10 {
			t.Run(fmt.Sprintf("%s/%d", mode, i), func(t *testing.T) { presenceRenewalsStopAtDeadline(t, mode) })
		}
	}
}

func presenceRenewalsStopAtDeadline(t *testing.T, mode string) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	const (
		leaseDuration = 60 * time.Second
		renewDeadline = 40 * time.Second
		// Not a divisor of the renew deadline: failed renewals at 35s
		// and 70s would miss it.
		retryPeriod = 35 * time.Second
	)
	fc := testingclock.NewFakeClock(time.Now())
	var failing atomic.Bool
	hanging := make(chan struct{}, 100)
	faults := leaseFaults{fake.NewClientset(), func(ctx context.Context) error {
		if !failing.Load() {
			return nil
		}
		if mode == "hang" {
			hanging <- struct{}{}
			<-ctx.Done() // as a real client: until its context ends
			return ctx.Err()
		}
		return apierrors.NewServiceUnavailable("etcd leader changed")
	}}
	cfg := presenceConfig("a", &testGauge{})
	cfg.LeaseDuration, cfg.RenewDeadline, cfg.RetryPeriod = leaseDuration, renewDeadline, retryPeriod
	cfg.Presence.Clock = fc

	w := runTimedWork(ctx, faults, cfg, fc.Now, nil)
	stoppedAt, result := &w.stoppedAt, w.result
	// The Lease was created (renewed) at t0 on the fake clock.
	t0 := within(t, w.started, "presence never started the work")
	failing.Store(true)

	// Advance the clock a second at a time while the attacher waits on
	// it, until the work stops.
	for stoppedAt.Load() == nil {
		if el := fc.Since(t0); el >= leaseDuration {
			t.Fatalf("%s renewals: still working %s after the last renewal, past the lease duration (%s): another replica may have taken the Lease over and work beside this one", mode, el, leaseDuration)
		}
		err := wait.PollUntilContextTimeout(ctx, time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
			return stoppedAt.Load() != nil || fc.HasWaiters(), nil
		})
		if err != nil {
			hung := ""
			if len(hanging) > 0 {
				hung = " (a renewal hangs)"
			}
			t.Fatalf("%s renewals: %s after the last renewal%s the work neither stopped nor does the attacher wait for the clock", mode, fc.Since(t0), hung)
		}
		if mode == "hang" && fc.Since(t0) >= retryPeriod && len(hanging) == 0 && stoppedAt.Load() == nil {
			// The renewal due at the retry period has started: let it
			// reach the API call and hang there before the clock runs on
			// (on a loaded machine it may not have got there yet, and the
			// deadline would pass with the renewal still on its way).
			within(t, hanging, "the renewal due at the retry period never reached the API")
			hanging <- struct{}{} // keep the count for the check below
		}
		if stoppedAt.Load() == nil {
			fc.Step(time.Second)
		}
	}
	el := stoppedAt.Load().Sub(t0)
	t.Logf("%s renewals: the work stopped %s after the last renewal", mode, el)
	if el < renewDeadline {
		t.Errorf("%s renewals: the work stopped %s after the last renewal, before the renew deadline (%s)", mode, el, renewDeadline)
	}
	if el >= leaseDuration {
		t.Errorf("%s renewals: the work stopped %s after the last renewal, not before the lease duration (%s)", mode, el, leaseDuration)
	}
	if mode == "hang" && len(hanging) == 0 {
		t.Error("no renewal hung: the scenario did not happen")
	}
	if err := within(t, result, "RunAsLeader did not return after the work stopped"); !errors.Is(err, ErrLostLease) {
		t.Errorf("RunAsLeader = %v, want ErrLostLease", err)
	}
}

// timedWork is RunAsLeader running work that notes, on a test clock, when
// it started and when its context ended; result gets RunAsLeader's error.
type timedWork struct {
	started   chan time.Time
	stoppedAt atomic.Pointer[time.Time]
	result    chan error
}

// runTimedWork starts RunAsLeader with a timedWork's work; onStart (if
// not nil) runs first in the work.
func runTimedWork(ctx context.Context, client kubernetes.Interface, cfg LeaderElection, now func() time.Time, onStart func()) *timedWork {
	w := &timedWork{started: make(chan time.Time, 1), result: make(chan error, 1)}
	go func() {
		w.result <- RunAsLeader(ctx, client, cfg, nil, func(runCtx context.Context) error {
			if onStart != nil {
				onStart()
			}
			w.started <- now()
			<-runCtx.Done()
			at := now()
			w.stoppedAt.Store(&at)
			return runCtx.Err()
		})
	}()
	return w
}
