package runner

import (
	"context"
	"strings"
	"testing"
	"time"

	"k8s.io/component-base/metrics/testutil"
	testingclock "k8s.io/utils/clock/testing"
)

func TestBacklog_oldestItemAgeTracksTheLongestWaitingKey(t *testing.T) {
	started := make(chan struct{})
	release := make(chan struct{})
	h := startHarness(t, Options{Name: "backlog", Workers: 1}, func(_ context.Context, key string, _ int) (Result, error) {
		if key == "busy" {
			close(started)
			<-release
		}
		return Result{}, nil
	})
	if got := h.runner.OldestItemAge(); got != 0 {
		t.Fatalf("empty queue: OldestItemAge = %v, want 0", got)
	}
	h.runner.Enqueue("busy") // occupies the only worker
	<-started
	h.expectCall("busy", t0)

	h.runner.Enqueue("x")
	h.clock.Step(3 * time.Second)
	h.runner.Enqueue("y")
	h.runner.Enqueue("x") // re-adding keeps x's place and age
	h.clock.Step(2 * time.Second)

	if got := h.runner.OldestItemAge(); got != 5*time.Second {
		t.Fatalf("OldestItemAge = %v, want 5s (x has waited since t0)", got)
	}
	if got := h.runner.Len(); got != 2 {
		t.Fatalf("Len = %d, want 2", got)
	}
	want := `
# HELP latch_workqueue_oldest_item_age_seconds [ALPHA] Seconds the oldest item ready for processing has been waiting in the workqueue; 0 when empty.
# TYPE latch_workqueue_oldest_item_age_seconds gauge
latch_workqueue_oldest_item_age_seconds{name="backlog"} 5
`
	if err := testutil.CustomCollectAndCompare(h.runner.BacklogCollector(), strings.NewReader(want), OldestItemAgeMetricName); err != nil {
		t.Fatal(err)
	}

	close(release)
	h.waitPass("busy")
	for range 2 {
		select {
		case <-h.passes:
		case <-time.After(10 * time.Second):
			t.Fatal("backlog not processed")
		}
	}
	if got := h.runner.OldestItemAge(); got != 0 {
		t.Fatalf("drained queue: OldestItemAge = %v, want 0", got)
	}
}

// A start burst that enqueues every settled key in the second lane leaves
// no storage sized for it once drained: the lanes' arrays go and the maps
// that grew past shrinkAbove are made anew. Every key is still popped
// once, first lane first, in readiness order.
func TestTimedFIFO_drainedBurstLeavesNoGrownStorage(t *testing.T) {
	q := newTimedFIFO[int](testingclock.NewFakeClock(t0))
	const n = 3 * shrinkAbove
	for k := range n {
		q.markLater(k)
		q.Push(k)
	}
	q.Push(-1)
	q.Touch(7) // a plain add moves 7 to the first lane
	if q.inLaterPeak != n {
		t.Fatalf("inLater peak %d, want %d", q.inLaterPeak, n)
	}
	want := append([]int{-1, 7}, func() (ks []int) {
		for k := range n {
			if k != 7 {
				ks = append(ks, k)
			}
		}
		return ks
	}()...)
	for i, w := range want {
		if got := q.Pop(); got != w {
			t.Fatalf("pop %d = %d, want %d", i, got, w)
		}
	}
	if q.Len() != 0 || q.items != nil || q.later != nil {
		t.Fatalf("drained: Len %d, items %v (cap %d), later cap %d; want 0 and no arrays", q.Len(), q.items, cap(q.items), cap(q.later))
	}
	if q.inLaterPeak != 0 || len(q.inLater) != 0 || len(q.marks) != 0 {
		t.Fatalf("drained: inLater %d (peak %d), marks %d; want a new empty inLater and no marks", len(q.inLater), q.inLaterPeak, len(q.marks))
	}
	// Marks taken back one by one (unmark) shrink the same way.
	for k := range n {
		q.markLater(k)
	}
	if q.marksPeak != n {
		t.Fatalf("marks peak %d, want %d", q.marksPeak, n)
	}
	for k := range n {
		q.unmark(k)
	}
	if q.marksPeak != 0 || len(q.marks) != 0 {
		t.Fatalf("unmarked: marks %d (peak %d), want a new empty map", len(q.marks), q.marksPeak)
	}
}

// A plain add finds its key in the second lane after items have left the
// lane's front, also after the lane was emptied and filled again.
func TestTimedFIFO_plainAddFindsItsKeyAfterPops(t *testing.T) {
	q := newTimedFIFO[string](testingclock.NewFakeClock(t0))
	later := func(keys ...string) {
		for _, k := range keys {
			q.markLater(k)
			q.Push(k)
		}
	}
	pop := func(want ...string) {
		t.Helper()
		for _, w := range want {
			if got := q.Pop(); got != w {
				t.Fatalf("Pop = %q, want %q", got, w)
			}
		}
	}
	later("a", "b", "c", "d")
	pop("a")
	q.Touch("c")
	pop("c", "b", "d")
	later("e", "f")
	q.Touch("f")
	pop("f", "e")
	if q.Len() != 0 {
		t.Fatalf("Len = %d, want 0", q.Len())
	}
}
