package app

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"
)

type testGauge struct {
	mu  sync.Mutex
	v   float64
	max float64
}

func (g *testGauge) Set(v float64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.v, g.max = v, max(g.max, v)
}

func (g *testGauge) get() (float64, float64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.v, g.max
}

func presenceConfig(identity string, g GaugeSetter) LeaderElection {
	return LeaderElection{
		LeaseName: "test-lease", Namespace: "default", Identity: identity,
		LeaseDuration: time.Second, RetryPeriod: 10 * time.Millisecond,
		Presence: &Presence{Component: "csi-attacher", Competing: g},
	}
}

func TestDecidePresence(t *testing.T) {
	lease := func(holder *string, seconds int32) *coordinationv1.Lease {
		return &coordinationv1.Lease{Spec: coordinationv1.LeaseSpec{HolderIdentity: holder, LeaseDurationSeconds: &seconds}}
	}
	const me, pod = "me_2_pod-u1", "u1"
	tests := []struct {
		name      string
		lease     *coordinationv1.Lease
		podUID    string
		working   bool
		unchanged time.Duration
		want      presenceStep
	}{
		{"no Lease: create it", nil, pod, false, 0, stepCreate},
		{"ours: renew", lease(ptr.To(me), 15), pod, false, time.Hour, stepRenew},
		{"ours while working: renew", lease(ptr.To(me), 15), pod, true, 0, stepRenew},
		{"released (empty holder): take over at once", lease(ptr.To(""), 1), pod, false, 0, stepTakeOver},
		{"no holder field: take over", lease(nil, 15), pod, false, 0, stepTakeOver},
		{"other holder renewing: wait", lease(ptr.To("other"), 15), pod, false, 14 * time.Second, stepWait},
		{"other holder exactly at the lease duration: still wait", lease(ptr.To("other"), 15), pod, false, 15 * time.Second, stepWait},
		{"other holder silent for longer than its lease: take over", lease(ptr.To("other"), 15), pod, false, 16 * time.Second, stepTakeOver},
		{"this Pod's previous process, just renewed: take over at once", lease(ptr.To("me_1_pod-u1"), 15), pod, false, 0, stepSucceed},
		{"this Pod's previous process while working: a second attacher in the Pod, stop", lease(ptr.To("me_1_pod-u1"), 15), pod, true, 0, stepWait},
		{"another Pod's process renewing: wait", lease(ptr.To("other_1_pod-u2"), 15), pod, false, 0, stepWait},
		{"another Pod whose UID ends like ours: wait", lease(ptr.To("other_1_pod-xu1"), 15), pod, false, 0, stepWait},
		{"another Pod's process silent for longer than its lease: take over", lease(ptr.To("other_1_pod-u2"), 15), pod, false, 16 * time.Second, stepTakeOver},
		{"own Pod not known: a holder with a Pod UID is another instance", lease(ptr.To("me_1_pod-u1"), 15), "", false, 0, stepWait},
		{"own Pod not known: a holder without one is another instance", lease(ptr.To("me_1"), 15), "", false, 0, stepWait},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			self := me
			if tt.podUID == "" {
				self = "me_2"
			}
			f := presenceFacts{lease: tt.lease, self: self, podUID: tt.podUID, working: tt.working, unchangedFor: tt.unchanged}
			if got := decidePresence(f); got != tt.want {
				t.Errorf("decidePresence = %v, want %v", got, tt.want)
			}
		})
	}
}

// Working without leader election, the attacher finds another identity
// holding the Lease (it failed to renew and the other took over): the work
// in flight is aborted at once and ErrCompetingInstance returned; the
// gauge says 1.
func TestPresenceWhileWorkingAnotherHolderAbortsRunAndReturnsErrCompetingInstance(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	for i := range 5 {
		// The API server's resourceVersions: our renewal, based on our
		// last write, must not overwrite b's.
		client := leaseAPI()
		g := &testGauge{}
		started := make(chan struct{})
		aborted := make(chan struct{})
		result := make(chan error, 1)
		go func() {
			result <- RunAsLeader(ctx, client, presenceConfig("a", g), nil, func(runCtx context.Context) error {
				close(started)
				<-runCtx.Done()
				close(aborted)
				return runCtx.Err()
			})
		}()
		<-started
		if h := holder(t, ctx, client); h != "a" {
			t.Fatalf("iteration %d: Lease holder = %q while working, want a", i, h)
		}
		l, err := client.CoordinationV1().Leases("default").Get(ctx, "test-lease", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		l.Spec.HolderIdentity = ptr.To("b")
		l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
		if _, err := client.CoordinationV1().Leases("default").Update(ctx, l, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := within(t, result, fmt.Sprintf("iteration %d: RunAsLeader did not return after another identity took the Lease", i)); !errors.Is(err, ErrCompetingInstance) {
			t.Fatalf("iteration %d: RunAsLeader = %v, want ErrCompetingInstance", i, err)
		}
		select {
		case <-aborted:
		default:
			t.Errorf("iteration %d: run's context was not cancelled before RunAsLeader returned", i)
		}
		if v, _ := g.get(); v != 1 {
			t.Errorf("iteration %d: competing gauge = %v, want 1", i, v)
		}
		if h := holder(t, ctx, client); h != "b" {
			t.Errorf("iteration %d: Lease holder = %q after giving up, want b (untouched)", i, h)
		}
	}
}

// A Lease held by an identity that stopped renewing (killed without
// releasing) is taken over after its lease duration, measured on our clock;
// until then nothing runs.
func TestPresenceTakesOverAnExpiredLeaseAfterItsDuration(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	client := fake.NewClientset(&coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "test-lease"},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity: ptr.To("dead"), LeaseDurationSeconds: ptr.To(int32(1)),
			RenewTime: &metav1.MicroTime{Time: time.Now()}, LeaseTransitions: ptr.To(int32(3)),
		},
	})
	g := &testGauge{}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	start := time.Now()
	started := make(chan time.Time, 1)
	result := make(chan error, 1)
	go func() {
		result <- RunAsLeader(ctx, client, presenceConfig("a", g), nil, func(runCtx context.Context) error {
			started <- time.Now()
			<-runCtx.Done()
			return nil
		})
	}()
	at := within(t, started, "never took over the expired Lease")
	if d := at.Sub(start); d < time.Second {
		t.Errorf("started %s after start, want at least the holder's lease duration (1s)", d)
	}
	if v, m := g.get(); v != 0 || m != 1 {
		t.Errorf("gauge now %v (max %v), want 1 while waiting and 0 once holding", v, m)
	}
	l, err := client.CoordinationV1().Leases("default").Get(ctx, "test-lease", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ptr.Deref(l.Spec.HolderIdentity, "") != "a" || ptr.Deref(l.Spec.LeaseTransitions, 0) != 4 {
		t.Errorf("Lease holder %v transitions %v, want a and 4", ptr.Deref(l.Spec.HolderIdentity, ""), ptr.Deref(l.Spec.LeaseTransitions, 0))
	}
	stop()
	if err := <-result; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("RunAsLeader = %v", err)
	}
	// Stopping releases the Lease, so the next instance starts at once.
	if h := holder(t, context.Background(), client); h != "" {
		t.Errorf("Lease holder = %q after stopping, want released", h)
	}
}

// Without RBAC for Leases the check is impossible; the attacher works
// anyway (upstream's behaviour without leader election) and says so.
func TestPresenceWithoutLeaseAccessRunsUnguarded(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	client := fake.NewClientset()
	client.PrependReactor("get", "leases", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}, "test-lease", errors.New("no RBAC"))
	})
	ran := false
	err := RunAsLeader(ctx, client, presenceConfig("a", &testGauge{}), nil, func(context.Context) error { ran = true; return nil })
	if err != nil || !ran {
		t.Fatalf("RunAsLeader = %v, ran = %v; want run called and nil", err, ran)
	}
}

// On SIGTERM the work in flight drains; the Lease must stay renewed
// meanwhile (as the elector keeps it), or a waiting instance would start
// next to calls still in flight. Released once run has returned.
func TestPresenceRenewsTheLeaseWhileRunDrainsThenReleasesIt(t *testing.T) {
	_, testCtx := ktesting.NewTestContext(t)
	client := fake.NewClientset()
	ctx, stop := context.WithCancel(testCtx)
	started, drained := make(chan struct{}), make(chan struct{})
	// Unlike the fake, a real client fails requests of a cancelled context.
	honest := ctxClient(client)
	result := make(chan error, 1)
	go func() {
		result <- RunAsLeader(ctx, honest, presenceConfig("a", &testGauge{}), nil, func(runCtx context.Context) error {
			close(started)
			<-runCtx.Done()
			<-drained
			return nil
		})
	}()
	<-started
	stop()
	renewTime := func() time.Time {
		l, err := client.CoordinationV1().Leases("default").Get(testCtx, "test-lease", metav1.GetOptions{})
		if err != nil || l.Spec.RenewTime == nil {
			t.Fatalf("Lease: %v", err)
		}
		return l.Spec.RenewTime.Time
	}
	time.Sleep(50 * time.Millisecond)
	before := renewTime()
	time.Sleep(300 * time.Millisecond) // thirty retry periods of draining
	if after := renewTime(); !after.After(before) || holder(t, testCtx, client) != "a" {
		t.Errorf("while run drains: renew time %s → %s, holder %q; want renewed by a", before, after, holder(t, testCtx, client))
	}
	close(drained)
	if err := <-result; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("RunAsLeader = %v", err)
	}
	if h := holder(t, testCtx, client); h != "" {
		t.Errorf("Lease holder = %q after run returned, want released", h)
	}
}

// ctxClient fails Lease requests whose context is done, as a real client
// does; the fake ignores contexts.
func ctxClient(c *fake.Clientset) leaseFaults {
	return leaseFaults{c, func(ctx context.Context) error { return ctx.Err() }}
}
