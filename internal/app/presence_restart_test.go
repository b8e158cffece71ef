package app

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
)

// csi-attacher without --leader-election, its container restarted: the
// Lease is still held by the previous process, which was killed without
// releasing it a moment after its last renewal. A new process of the same
// Pod (same Pod UID) takes the Lease over at once, reporting nothing; a
// process of another Pod, or one that does not know its Pod, waits for
// the lease duration and reports the holder as another active instance.
// The clock is a fake one that the test advances only after checking
// the start: a process that waited would never start before that.
func TestPresenceRestartedContainerTakesOverItsOwnPodsLeaseAtOnce(t *testing.T) {
	tests := []struct {
		name, holder, podUID string
		atOnce               bool
	}{
		{"same Pod: at once", "host_1_pod-uid-a", "uid-a", true},
		{"another Pod: waits", "host-b_1_pod-uid-b", "uid-a", false},
		{"own Pod not known: waits", "host_1_pod-uid-a", "", false},
		{"holder of an older build without a Pod: waits", "host_1", "uid-a", false},
	}
	for _, tt := range tests {
		for i := range 5 {
			t.Run(fmt.Sprintf("%s/%d", tt.name, i), func(t *testing.T) {
				presenceRestart(t, tt.holder, tt.podUID, tt.atOnce)
			})
		}
	}
}

func presenceRestart(t *testing.T, prevHolder, podUID string, atOnce bool) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	fc := testingclock.NewFakeClock(time.Now())
	renewed := metav1.NewMicroTime(fc.Now())
	client := fake.NewClientset(&coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "test-lease"},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity: ptr.To(prevHolder), LeaseDurationSeconds: ptr.To(int32(15)),
			AcquireTime: &renewed, RenewTime: &renewed, LeaseTransitions: ptr.To(int32(3)),
		},
	})
	g := &testGauge{}
	cfg := presenceConfig("host_2", g)
	cfg.LeaseDuration, cfg.RetryPeriod = 15*time.Second, 5*time.Second
	cfg.Presence.Clock, cfg.Presence.PodUID = fc, podUID
	self := presenceIdentity("host_2", podUID)

	started := make(chan struct{})
	result := make(chan error, 1)
	go func() {
		result <- RunAsLeader(ctx, client, cfg, nil, func(runCtx context.Context) error {
			close(started)
			<-runCtx.Done()
			return runCtx.Err()
		})
	}()

	if atOnce {
		within(t, started, "the restarted process of the same Pod did not start without the clock advancing: it waits for its own predecessor's Lease to expire")
		if _, m := g.get(); m != 0 {
			t.Errorf("competing gauge reached %v: the restarted process reported its own predecessor as another instance", m)
		}
	} else {
		waitUntil(t, ctx, "the competing instance reported", func() bool {
			v, _ := g.get()
			return v == 1 && len(competingEvents(t, ctx, client)) == 1
		})
		select {
		case <-started:
			t.Fatalf("started while %q holds a fresh Lease", prevHolder)
		default:
		}
		evs := competingEvents(t, ctx, client)
		if !strings.Contains(evs[0], self) || !strings.Contains(evs[0], prevHolder) {
			t.Errorf("CompetingAttacher event %q, want it to name %q and %q", evs[0], self, prevHolder)
		}
		// The holder stays silent for its lease duration: taken over.
		// (The clock stops once it is: the process must not run into
		// its renew deadline before the test sees it work.)
		for holder(t, ctx, client) != self {
			waitUntil(t, ctx, "the waiting process waits on the clock", fc.HasWaiters)
			if holder(t, ctx, client) != self {
				fc.Step(time.Second)
			}
		}
		within(t, started, "took the Lease over but did not start")
		if el := fc.Since(renewed.Time); el <= 15*time.Second {
			t.Errorf("started %s after the holder's last renewal, want after its lease duration (15s)", el)
		}
	}
	l, err := client.CoordinationV1().Leases("default").Get(ctx, "test-lease", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h, n := ptr.Deref(l.Spec.HolderIdentity, ""), ptr.Deref(l.Spec.LeaseTransitions, 0); h != self || n != 4 {
		t.Errorf("Lease holder %q, transitions %d; want %q and 4", h, n, self)
	}
	if atOnce {
		if evs := competingEvents(t, ctx, client); len(evs) != 0 {
			t.Errorf("CompetingAttacher events %q, want none", evs)
		}
	}
	stop()
	if err := within(t, result, "RunAsLeader did not return"); err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("RunAsLeader = %v", err)
	}
}

// competingEvents are the CompetingAttacher events written so far.
func competingEvents(t *testing.T, ctx context.Context, client *fake.Clientset) []string {
	t.Helper()
	evs, err := client.CoreV1().Events("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, ev := range evs.Items {
		if ev.Reason == EventReasonCompetingAttacher {
			out = append(out, ev.Message)
		}
	}
	return out
}
