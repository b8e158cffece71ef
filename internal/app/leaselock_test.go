package app

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/latchcsi/latch/internal/testsupport"
)

type renewMarker struct{}

// renewFault switches renewFailing on, and counts the requests it failed.
type renewFault struct {
	on     atomic.Bool
	failed atomic.Int32
}

// renewFailing fails the Lease requests made under the elector's own
// context (its acquire and renew loop, which carries the caller's values)
// and lets through the ones made on a fresh context: client-go's release()
// runs on context.Background(). That is an API server that stopped
// answering renewals and answers again a moment later, when the elector
// gives the Lease up.
func renewFailing(ctx context.Context) error {
	if f, _ := ctx.Value(renewMarker{}).(*renewFault); f != nil && f.on.Load() {
		f.failed.Add(1)
		return apierrors.NewTimeoutError("slow API server", 1)
	}
	return nil
}

// A leader whose renewals fail (API server slow or cut off) for longer
// than the lease duration: replica b takes the Lease over. a's renew
// deadline then passes and client-go's elector releases the Lease
// (ReleaseOnCancel), deciding on the holder it observed before: without
// releaseGuardedLock that release cleared b's holder, so b, which is
// leading, no longer held the Lease, and any candidate (a restarted a, a
// third replica) could acquire it at once while b still worked.
func TestRunAsLeaderThatLostTheLeaseToAnotherLeavesTheirHoldAlone(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	client := fake.NewClientset()
	fault := new(renewFault)
	cfg := testElection("a")
	cfg.LeaseDuration, cfg.RenewDeadline, cfg.RetryPeriod = 2*time.Second, 1*time.Second, 50*time.Millisecond
	runCtx := make(chan context.Context, 1)
	result := make(chan error, 1)
	actx := context.WithValue(ctx, renewMarker{}, fault)
	go func() {
		result <- RunAsLeader(actx, leaseFaults{client, renewFailing}, cfg, nil, func(c context.Context) error {
			runCtx <- c
			<-c.Done()
			return nil
		})
	}()
	within(t, runCtx, "a never led")
	// From now on a's renewals fail. The renew deadline (1s) is shorter
	// than the lease duration (2s), yet with a slow API server the last
	// renewal b saw may be older than a's last success; model b taking
	// over (after a lease duration of silence, by b's clock) directly.
	fault.on.Store(true)
	// A renewal that passed the fault check just before it was switched
	// on may still be writing (the fake client checks no resourceVersion,
	// so it would overwrite b's hold below). The elector renews one
	// request at a time: once one has failed, none is in flight.
	testsupport.Eventually(t, ctx, 10*time.Second, "a renewal of a's to fail", func(context.Context) (bool, error) {
		return fault.failed.Load() > 0, nil
	})
	lease, err := client.CoordinationV1().Leases("default").Get(ctx, "test-lease", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	now := metav1.NewMicroTime(time.Now())
	lease.Spec.HolderIdentity, lease.Spec.AcquireTime, lease.Spec.RenewTime = ptr.To("b"), &now, &now
	lease.Spec.LeaseDurationSeconds = ptr.To(int32(15))
	if _, err := client.CoordinationV1().Leases("default").Update(ctx, lease, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := within(t, result, "a never noticed it lost the lease"); err == nil {
		t.Log("RunAsLeader returned nil")
	}
	if h := holder(t, ctx, client); h != "b" {
		t.Errorf("after a lost its lease and gave up, the Lease holder is %q; want b (the leader that took over) untouched: a's release cleared the new leader's hold", h)
	}
}
