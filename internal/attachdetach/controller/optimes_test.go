package controller

import (
	"testing"
	"time"

	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/testutil"

	"github.com/latchcsi/latch/internal/attachdetach/state"
)

// opTimes (metrics.go) feeds the operation duration histogram: each
// attach and detach that finishes is observed once, from its start; a
// cancelled or superseded one is not observed; the number of unfinished
// operations it remembers is bounded.
func TestOpTimes_observesEachFinishedOperationOnce_forgetsCancelledOnes(t *testing.T) {
	m := NewMetrics()
	m.Register(metrics.NewKubeRegistry())
	o := newOpTimes()
	t0 := time.Unix(1000, 0)
	key := state.Key{Volume: uniqueName("vol-1"), Node: "node-a"}
	observed := func(op string) (uint64, float64) {
		t.Helper()
		h := m.operationDuration.WithLabelValues(op, testDriver)
		n, err := testutil.GetHistogramMetricCount(h)
		if err != nil {
			t.Fatal(err)
		}
		sum, err := testutil.GetHistogramMetricValue(h)
		if err != nil {
			t.Fatal(err)
		}
		return n, sum
	}

	o.attachStarted(key, t0)
	o.attachDone(key, t0.Add(2*time.Second), m)
	o.attachDone(key, t0.Add(5*time.Second), m) // a second confirmation
	if n, sum := observed("attach"); n != 1 || sum != 2 {
		t.Errorf("attach: %d observations summing %vs, want one of 2s", n, sum)
	}

	o.detachStarted("va-1", key, t0)
	o.detachCancelled("va-1") // the delete call failed
	o.detached("va-1", t0.Add(time.Second), m)
	o.detachStarted("va-1", key, t0)
	o.detached("va-1", t0.Add(3*time.Second), m)
	if n, sum := observed("detach"); n != 1 || sum != 3 {
		t.Errorf("detach: %d observations summing %vs, want one of 3s", n, sum)
	}

	// A detach of the key supersedes its unfinished attach.
	o.attachStarted(key, t0)
	o.detachStarted("va-1", key, t0)
	o.attachDone(key, t0.Add(9*time.Second), m)
	if n, _ := observed("attach"); n != 1 {
		t.Errorf("attach observations = %d after a superseded attach, want still 1", n)
	}

	bounded := newOpTimes()
	bounded.maxSize = 1
	bounded.attachStarted(key, t0)
	bounded.attachStarted(state.Key{Volume: uniqueName("vol-2"), Node: "node-a"}, t0)
	if len(bounded.attach) != 1 {
		t.Errorf("%d attaches remembered, want at most maxSize 1", len(bounded.attach))
	}
}
