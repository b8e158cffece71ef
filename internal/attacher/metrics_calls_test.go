package attacher

import (
	"sync"
	"testing"
	"time"

	"k8s.io/component-base/metrics"

	"github.com/latchcsi/latch/internal/adaptive"
	"github.com/latchcsi/latch/internal/csimock"
)

// callWaitGauges gathers the call-wait gauges of reg: for each operation,
// the calls waiting and the oldest wait in seconds.
func callWaitGauges(t *testing.T, reg metrics.KubeRegistry) (waiting, oldest map[string]float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	waiting, oldest = map[string]float64{}, map[string]float64{}
	for _, mf := range mfs {
		out := map[string]map[string]float64{callsWaitingMetricName: waiting, callOldestWaitName: oldest}[mf.GetName()]
		if out == nil {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "operation" {
					out[l.GetValue()] = m.GetGauge().GetValue()
				}
			}
		}
	}
	return waiting, oldest
}

// An attach that waits for a CSI call slot (the limit: one call in
// flight; another publish holds it for a second) is shown by
// latch_attacher_driver_calls_waiting and
// latch_attacher_driver_call_oldest_wait_seconds, with operation="attach":
// its VolumeAttachment is held by a worker, so the workqueue's depth and
// age do not count it. Both are 0 again once it got its slot.
func TestCallsWaitingForASlotAreShownInTheMetrics(t *testing.T) {
	f := newExecFixture(t, execPV("pv-a"), execVA("va-a", "pv-a"), execPV("pv-b"), execVA("va-b", "pv-b"), execCSINode())
	if _, err := f.driver.AddFault(csimock.Rule{Method: "ControllerPublishVolume", Latency: time.Second}); err != nil {
		t.Fatal(err)
	}
	reg := metrics.NewKubeRegistry()
	reg.CustomMustRegister(f.ctrl.CallWaitCollector())
	if waiting, oldest := callWaitGauges(t, reg); waiting["attach"] != 0 || waiting["detach"] != 0 || oldest["attach"] != 0 || oldest["detach"] != 0 {
		t.Fatalf("before any call: waiting %v, oldest %v; want 0 for attach and detach", waiting, oldest)
	}
	var wg sync.WaitGroup
	start := func(name string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := f.ctrl.syncAttach(f.ctx, name); err != nil {
				t.Errorf("syncAttach %s: %v", name, err)
			}
		}()
	}
	start("va-a")
	f.waitFor("the first publish holds the slot", func() bool { a, _ := f.ctrl.exec.calls.InFlight(); return a == 1 })
	start("va-b")
	f.waitFor("the second publish waits for it", func() bool { n, _ := f.ctrl.exec.calls.Waiting(adaptive.Attach); return n == 1 })
	time.Sleep(100 * time.Millisecond)
	waiting, oldest := callWaitGauges(t, reg)
	if waiting["attach"] != 1 || waiting["detach"] != 0 {
		t.Errorf("one publish waiting for the slot: latch_attacher_driver_calls_waiting %v, want attach 1, detach 0", waiting)
	}
	if oldest["attach"] < 0.1 || oldest["attach"] > 5 || oldest["detach"] != 0 {
		t.Errorf("latch_attacher_driver_call_oldest_wait_seconds %v, want attach 0.1-5 s (it waits since before the sleep), detach 0", oldest)
	}
	wg.Wait()
	if waiting, oldest := callWaitGauges(t, reg); waiting["attach"] != 0 || oldest["attach"] != 0 {
		t.Errorf("after both publishes: waiting %v, oldest %v; want 0", waiting, oldest)
	}
	f.requireCSICalls("ControllerPublishVolume handle-pv-a node-1-id OK", "ControllerPublishVolume handle-pv-b node-1-id OK")
}
