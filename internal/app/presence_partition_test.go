package app

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
)

// partitioned fails every Lease request while cut is set, as a replica
// cut off from the API server sees it (its driver, a sidecar in the same
// Pod, still answers).
func partitioned(cut *atomic.Bool) func(context.Context) error {
	return func(context.Context) error {
		if cut.Load() {
			return apierrors.NewServiceUnavailable("partitioned")
		}
		return nil
	}
}

// Two csi-attachers of one driver without --leader-election (presence
// mode). "a" holds the Lease and works; then "a" is cut off from the API
// server (its renewals fail) but keeps running its workers against the
// driver. "b" waits one lease duration, takes the Lease over and starts
// working. At that moment "a" must no longer be working: it cannot know
// whether b took over, and the Lease it last renewed has expired on every
// other replica's clock. Otherwise both call ControllerPublish /
// ControllerUnpublish for the same VolumeAttachments, the race presence
// mode exists to rule out (a stale publish of a lands after b unpublished
// the volume and published it elsewhere: RWO volume on two nodes, and a's
// publication is never recorded because a's status write fails too).
func TestPresenceRenewalsFailingForTheRenewDeadlineStopTheWorkBeforeAnotherTakesOver(t *testing.T) {
	// A race between two clocks' timers: run the scenario several times.
	for i := range 4 {
		t.Run(fmt.Sprint(i), presenceCutOffBeforeTakeover)
	}
}

func presenceCutOffBeforeTakeover(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	client := fake.NewClientset()
	var cut atomic.Bool

	aStarted := make(chan struct{})
	aRunCtx := make(chan context.Context, 1)
	aResult := make(chan error, 1)
	go func() {
		aResult <- RunAsLeader(ctx, leaseFaults{client, partitioned(&cut)}, presenceConfig("a", &testGauge{}), nil, func(runCtx context.Context) error {
			aRunCtx <- runCtx
			close(aStarted)
			<-runCtx.Done()
			return runCtx.Err()
		})
	}()
	<-aStarted
	runA := <-aRunCtx
	if h := holder(t, ctx, client); h != "a" {
		t.Fatalf("holder = %q, want a", h)
	}

	// a is partitioned from the API server: no renewals from now on.
	cut.Store(true)
	cutAt := time.Now()

	bStarted := make(chan time.Time, 1)
	bResult := make(chan error, 1)
	go func() {
		bResult <- RunAsLeader(ctx, client, presenceConfig("b", &testGauge{}), nil, func(runCtx context.Context) error {
			bStarted <- time.Now()
			<-runCtx.Done()
			return runCtx.Err()
		})
	}()
	at := within(t, bStarted, "b never took over the Lease a stopped renewing")
	t.Logf("b started working %s after a was partitioned", at.Sub(cutAt).Round(time.Millisecond))

	// a stops at its renew deadline, before b's lease duration ran out.
	if runA.Err() == nil {
		t.Errorf("presence mode: a (partitioned, Lease expired %s ago by b's clock) still works while b works: two active csi-attachers of one driver", time.Since(cutAt).Round(time.Millisecond))
	}

	stop()
	cut.Store(false)
	if err := within(t, aResult, "a's RunAsLeader did not return"); !errors.Is(err, ErrLostLease) {
		t.Errorf("a's RunAsLeader = %v, want ErrLostLease (renewals failed for the renew deadline)", err)
	}
	if err := within(t, bResult, "b's RunAsLeader did not return"); err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("b's RunAsLeader = %v, want nil or canceled", err)
	}
}
