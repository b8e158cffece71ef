package app

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"

	"github.com/latchcsi/latch/internal/runner"
)

func testElection(identity string) LeaderElection {
	return LeaderElection{
		Enabled: true, LeaseName: "test-lease", Namespace: "default", Identity: identity,
		LeaseDuration: time.Minute, RenewDeadline: 40 * time.Second, RetryPeriod: 10 * time.Millisecond,
	}
}

func holder(t *testing.T, ctx context.Context, client *fake.Clientset) string {
	t.Helper()
	l, err := client.CoordinationV1().Leases("default").Get(ctx, "test-lease", metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// within returns what ch delivers, or fails the test saying what did not
// happen when nothing comes within 10 seconds.
func within[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatal(what)
		panic("unreachable")
	}
}

func waitUntil(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) { return cond(), nil }); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

func TestRunAsLeaderKeepsLeaseUntilRunHasDrainedThenReleasesIt(t *testing.T) {
	_, testCtx := ktesting.NewTestContext(t)
	client := fake.NewClientset()
	ctx, stop := context.WithCancel(testCtx)
	defer stop()

	started, stopping, drained := make(chan struct{}), make(chan struct{}), make(chan struct{})
	result := make(chan error, 1)
	go func() {
		result <- RunAsLeader(ctx, client, testElection("a"), nil, func(runCtx context.Context) error {
			close(started)
			<-runCtx.Done()
			close(stopping)
			<-drained // work in flight finishing
			return nil
		})
	}()
	within(t, started, "run not started")
	if h := holder(t, testCtx, client); h != "a" {
		t.Fatalf("lease holder = %q while running, want a", h)
	}

	stop()
	<-stopping
	// run is still draining: the lease must stay ours meanwhile, or a
	// standby would start next to calls still in flight.
	time.Sleep(100 * time.Millisecond)
	if h := holder(t, testCtx, client); h != "a" {
		t.Fatalf("lease holder = %q while run drains, want a", h)
	}
	select {
	case err := <-result:
		t.Fatalf("RunAsLeader returned (%v) before run finished", err)
	default:
	}

	close(drained)
	if err := within(t, result, "RunAsLeader did not return after run finished"); err != nil {
		t.Fatalf("RunAsLeader = %v, want nil after a clean stop", err)
	}
	if h := holder(t, testCtx, client); h != "" {
		t.Errorf("lease holder = %q after shutdown, want released (empty)", h)
	}
}

func TestRunAsLeaderReturnsRunErrorAndReleasesLease(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	client := fake.NewClientset()
	boom := errors.New("caches did not sync")
	err := RunAsLeader(ctx, client, testElection("a"), nil, func(context.Context) error { return boom })
	if !errors.Is(err, boom) {
		t.Fatalf("RunAsLeader = %v, want %v", err, boom)
	}
	if h := holder(t, ctx, client); h != "" {
		t.Errorf("lease holder = %q after run failed, want released", h)
	}
}

func TestRunAsLeaderCandidateStopsAtOnceWithoutRunning(t *testing.T) {
	_, testCtx := ktesting.NewTestContext(t)
	client := fake.NewClientset()
	// "other" holds a valid lease; our candidate can never acquire it.
	otherCtx, stopOther := context.WithCancel(testCtx)
	otherDone := make(chan struct{})
	go func() {
		defer close(otherDone)
		_ = RunAsLeader(otherCtx, client, testElection("other"), nil, func(ctx context.Context) error { <-ctx.Done(); return nil })
	}()
	waitUntil(t, testCtx, "lease held by other", func() bool { return holder(t, testCtx, client) == "other" })

	ctx, stop := context.WithCancel(testCtx)
	result := make(chan error, 1)
	ran := false
	go func() {
		result <- RunAsLeader(ctx, client, testElection("a"), nil, func(context.Context) error { ran = true; return nil })
	}()
	time.Sleep(50 * time.Millisecond)
	stop()
	if err := within(t, result, "candidate did not stop"); err != nil {
		t.Errorf("candidate RunAsLeader = %v, want nil", err)
	}
	if ran {
		t.Error("run was called without holding the lease")
	}
	if h := holder(t, testCtx, client); h != "other" {
		t.Errorf("lease holder = %q, want other untouched", h)
	}
	stopOther()
	<-otherDone
}

func TestRunAsLeaderLosingTheLeaseStopsRunAndReturnsErrLostLease(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	client := fake.NewClientset()
	cfg := testElection("a")
	cfg.LeaseDuration, cfg.RenewDeadline = 2*time.Second, 300*time.Millisecond
	// The fake does not check resourceVersions; once the lease is taken
	// over, refuse a's stale renewals the way the API server would. (The
	// reactor is installed before the elector runs: the fake's reactor
	// list is not safe to change concurrently.)
	var intruded atomic.Bool
	client.PrependReactor("update", "leases", func(action clienttesting.Action) (bool, runtime.Object, error) {
		l := action.(clienttesting.UpdateAction).GetObject().(*coordinationv1.Lease)
		if intruded.Load() && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity == "a" {
			return true, nil, apierrors.NewConflict(coordinationv1.Resource("leases"), l.Name, errors.New("stale resourceVersion"))
		}
		return false, nil, nil
	})
	started, runStopped := make(chan struct{}), make(chan struct{})
	reconcileErr := make(chan error, 1)
	result := make(chan error, 1)
	go func() {
		result <- RunAsLeader(ctx, client, cfg, nil, func(runCtx context.Context) error {
			// A reconcile in flight when the lease goes: it must be
			// cancelled at once, not drained (the drain timeout is an hour).
			r := runner.New[string](runner.ReconcilerFunc[string](func(ctx context.Context, _ string) (runner.Result, error) {
				close(started)
				<-ctx.Done()
				reconcileErr <- ctx.Err()
				return runner.Result{}, nil
			}), runner.Options{Name: "lease_test", Workers: 1, DrainTimeout: time.Hour})
			r.Enqueue("a")
			err := r.Run(runCtx)
			close(runStopped)
			return err
		})
	}()
	<-started
	// Another replica overwrites the lease: renewals now fail.
	lease, err := client.CoordinationV1().Leases("default").Get(ctx, "test-lease", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	intruder, duration, now := "intruder", int32(60), metav1.NewMicroTime(time.Now())
	lease.Spec.HolderIdentity, lease.Spec.LeaseDurationSeconds, lease.Spec.RenewTime, lease.Spec.AcquireTime = &intruder, &duration, &now, &now
	// Refuse a's writes before the intruder's lands: a renewal of a's
	// between the two would overwrite the intruder (the fake clientset
	// checks no resourceVersion).
	intruded.Store(true)
	if _, err := client.CoordinationV1().Leases("default").Update(ctx, lease, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := within(t, result, "RunAsLeader did not notice the lost lease"); !errors.Is(err, ErrLostLease) {
		t.Fatalf("RunAsLeader = %v, want ErrLostLease", err)
	}
	select {
	case <-runStopped:
	default:
		t.Error("RunAsLeader returned before run stopped")
	}
	if err := <-reconcileErr; !errors.Is(err, context.Canceled) {
		t.Errorf("reconcile in flight saw %v when the lease was lost, want context.Canceled", err)
	}
	if h := holder(t, ctx, client); h != "intruder" {
		t.Errorf("lease holder = %q, want the intruder untouched", h)
	}
}

// TestRunAsLeaderRecordsLeaderElectionEventsOnTheLease: with a Recorder,
// the elector records "<identity> became leader" when it takes the Lease
// and "<identity> stopped leading" when it lets it go, Normal, reason
// LeaderElection, on the Lease, as upstream's elector does (test/interop
// compares the events with the external-attacher's and
// kube-controller-manager's).
func TestRunAsLeaderRecordsLeaderElectionEventsOnTheLease(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	client := fake.NewClientset()
	recorder := record.NewFakeRecorder(10)
	recorder.IncludeObject = true
	cfg := testElection("a")
	cfg.Recorder = recorder
	if err := RunAsLeader(ctx, client, cfg, nil, func(context.Context) error { return nil }); err != nil {
		t.Fatalf("RunAsLeader = %v, want nil", err)
	}
	want := []string{
		"Normal LeaderElection a became leader involvedObject{kind=Lease,apiVersion=coordination.k8s.io/v1}",
		"Normal LeaderElection a stopped leading involvedObject{kind=Lease,apiVersion=coordination.k8s.io/v1}",
	}
	for _, w := range want {
		if got := within(t, recorder.Events, "no event "+w); got != w {
			t.Fatalf("event = %q, want %q", got, w)
		}
	}
}

// TestRunAsLeaderWithoutElectionRecordsNoEvents: without
// --leader-election (presence), no LeaderElection events, as upstream,
// which has no elector then.
func TestRunAsLeaderWithoutElectionRecordsNoEvents(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	client := fake.NewClientset()
	recorder := record.NewFakeRecorder(10)
	cfg := testElection("a")
	cfg.Enabled = false
	cfg.Recorder = recorder
	cfg.Presence = &Presence{}
	if err := RunAsLeader(ctx, client, cfg, nil, func(context.Context) error { return nil }); err != nil {
		t.Fatalf("RunAsLeader = %v, want nil", err)
	}
	select {
	case e := <-recorder.Events:
		t.Fatalf("event %q without leader election, want none", e)
	default:
	}
}
