package app

import (
	"context"
	"errors"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
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
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("run not started")
	}
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
	select {
	case err := <-result:
		if err != nil {
			t.Fatalf("RunAsLeader = %v, want nil after a clean stop", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("RunAsLeader did not return after run finished")
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
	select {
	case err := <-result:
		if err != nil {
			t.Errorf("candidate RunAsLeader = %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("candidate did not stop")
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
