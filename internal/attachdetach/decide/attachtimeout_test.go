package decide_test

import (
	"testing"
	"time"

	. "github.com/latchcsi/latch/internal/attachdetach/decide"
	"github.com/latchcsi/latch/internal/attachdetach/state"
)

// The attach timeouts at kube-controller-manager's times: 2 minutes after
// the start, then 2 minutes after each retry, which follows the backoff
// 500 ms, 1 s, 2 s, ... capped at 2 m 2 s.
func TestAttachTimeouts_kcmCadence(t *testing.T) {
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	// The times of the first timeouts, written out.
	var at []time.Duration
	d, b := time.Duration(0), 500*time.Millisecond
	for range 12 {
		d += 2 * time.Minute
		at = append(at, d)
		d += b
		b = min(2*b, 2*time.Minute+2*time.Second)
	}
	if at[1] != 4*time.Minute+500*time.Millisecond || at[2] != 6*time.Minute+1500*time.Millisecond {
		t.Fatalf("reference times = %v", at[:3])
	}
	for i, tm := range at {
		n, next := AttachTimeouts(start, start.Add(tm-time.Millisecond))
		if n != i || !next.Equal(start.Add(tm)) {
			t.Errorf("just before timeout %d: n = %d, next = +%v; want %d, +%v", i+1, n, next.Sub(start), i, tm)
		}
		if n, _ := AttachTimeouts(start, start.Add(tm)); n != i+1 {
			t.Errorf("at timeout %d: n = %d", i+1, n)
		}
	}
	// The backoff is capped: after it the period is 2 m + 2 m 2 s.
	if got := at[11] - at[10]; got != 4*time.Minute+2*time.Second {
		t.Errorf("late period = %v", got)
	}
}

// The plan of a wait for the attacher: no event before the first timeout
// and a timer for it; after it, kube-controller-manager's text on every
// Pod, once per timeout.
func TestDecide_waitingForAttacher_timeoutEvents(t *testing.T) {
	in := Input{Key: keyOn(nodeA), Wanted: wants(rwo, podA), Actual: entry(state.StateAttaching, false, false), Node: ready, VA: vaPending, Now: t0}
	p := Decide(in)
	if p.Kind != KindWait || !p.AttachWaiting || len(p.Events) != 0 || p.RequeueAfter != AttachTimeout {
		t.Fatalf("fresh wait: %+v", p)
	}
	in.AttachWaitSince = in.Now.Add(-AttachTimeout)
	p = Decide(in)
	want := `AttachVolume.Attach failed for volume "pv1" : timed out waiting for external-attacher of csi.example.com CSI driver to attach volume h1`
	if p.AttachTimeouts != 1 || len(p.Events) != 1 || p.Events[0].Message != want || p.Events[0].Reason != ReasonFailedAttachVolume {
		t.Fatalf("after 2 m: %+v, want one event %q", p, want)
	}
	if p.RequeueAfter != AttachTimeout+500*time.Millisecond {
		t.Errorf("RequeueAfter = %v", p.RequeueAfter)
	}
	first := p.Events[0].DedupeKey
	in.AttachWaitSince = in.Now.Add(-2*AttachTimeout - 500*time.Millisecond)
	if p = Decide(in); p.AttachTimeouts != 2 || len(p.Events) != 1 || p.Events[0].DedupeKey == first {
		t.Errorf("second timeout: %+v, want a new event", p)
	}
}
