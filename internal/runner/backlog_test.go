package runner

import (
	"context"
	"strings"
	"testing"
	"time"

	"k8s.io/component-base/metrics/testutil"
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
