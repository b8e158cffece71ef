package controller

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/component-base/metrics/testutil"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/latchcsi/latch/internal/testsupport/fakeclock"
)

// A VolumeAttachment no attacher serves: like kube-controller-manager,
// the controller records FailedAttachVolume "timed out waiting for
// external-attacher" on the Pod 2 minutes after it created the
// VolumeAttachment, then again after each further 2 minutes plus
// upstream's retry backoff (500 ms, 1 s, ...), counts each timeout, and
// stops once the volume is attached.
func TestAttachTimeout_noAttacher_kcmEventAtKcmTimes(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	pv, pvc := boundClaim("vol-1", v1.ReadWriteOnce)
	w := newFakeWorld(t, Config{Workers: 2, Clock: clk}, managedNode("node-a"), pv, pvc, podUsing("app", "node-a", "vol-1"))
	name := upstreamVAName("vol-1", testDriver, "node-a")
	w.eventually("the VolumeAttachment created", func() bool { _, ok := w.va(name); return ok })
	fakeclock.SettledWaiters(clk)
	want := `Warning FailedAttachVolume AttachVolume.Attach failed for volume "vol-1" : timed out waiting for external-attacher of ` +
		testDriver + ` CSI driver to attach volume vol-1`
	timeouts := func() float64 {
		t.Helper()
		got, err := testutil.GetCounterValuesFromGatherer(w.registry, AttachTimeoutsMetric, map[string]string{}, "driver")
		if err != nil {
			t.Fatal(err)
		}
		return got[testDriver]
	}
	// step moves the clock by d and returns the events recorded by then.
	step := func(d time.Duration) []string {
		t.Helper()
		clk.Step(d)
		fakeclock.SettledWaiters(clk)
		time.Sleep(50 * time.Millisecond)
		w.settle()
		return w.recorded()
	}
	if got := w.recorded(); countPrefix(got, "Warning") != 0 {
		t.Fatalf("events before any timeout = %q", got)
	}
	if got := step(2*time.Minute - time.Second); len(got) != 0 {
		t.Fatalf("events 1 s before the first timeout = %q, want none", got)
	}
	if got := step(time.Second); len(got) != 1 || got[0] != want {
		t.Fatalf("events at 2 m = %q, want once %q", got, want)
	}
	// Upstream's next attempt starts 500 ms after the failure and waits 2
	// minutes again.
	if got := step(2*time.Minute + 500*time.Millisecond - time.Second); len(got) != 0 {
		t.Fatalf("events 1 s before the second timeout = %q, want none", got)
	}
	if got := step(time.Second); len(got) != 1 || got[0] != want {
		t.Fatalf("events at 4 m 0.5 s = %q, want once %q", got, want)
	}
	// The third after a 1 s backoff.
	if got := step(2*time.Minute + time.Second - 10*time.Millisecond); len(got) != 0 {
		t.Fatalf("events just before the third timeout = %q, want none", got)
	}
	if got := step(10 * time.Millisecond); len(got) != 1 || got[0] != want {
		t.Fatalf("events at 6 m 1.5 s = %q, want once %q", got, want)
	}
	if n := timeouts(); n != 3 {
		t.Errorf("%s{driver=%s} = %v, want 3", AttachTimeoutsMetric, testDriver, n)
	}
	// kube-controller-manager counts each timed-out attempt as a failed
	// operation.
	failed := map[string]string{"operation_name": "volume_attach", "status": "fail-unknown"}
	if n := w.histogramCount(StorageOperationDurationMetric, failed); n != 3 {
		t.Errorf("%s{volume_attach,fail-unknown} count = %d, want 3", StorageOperationDurationMetric, n)
	}

	// Attached: the success event, and no timeout any more.
	w.attach(name)
	w.eventually("the success event", func() bool {
		return countPrefix(w.recorded(), "Normal SuccessfulAttachVolume") == 1
	})
	if got := step(10 * time.Minute); countPrefix(got, "Warning") != 0 {
		t.Errorf("events after the attach = %q, want no warning", got)
	}
	if n := timeouts(); n != 3 {
		t.Errorf("%s after the attach = %v, want still 3", AttachTimeoutsMetric, n)
	}
}
