package controller

import (
	"testing"

	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/testutil"

	"github.com/latchcsi/latch/internal/attachdetach/state"
)

// A key counts once however many passes wait, and leaves the count of the
// plugin it waited for even when its last pass no longer knows the plugin
// (the Pod is gone: plugin "").
func TestWaitGauge_countsEachWaitingKeyOncePerLabel(t *testing.T) {
	gauge := metrics.NewGaugeVec(&metrics.GaugeOpts{Name: "test_waiting"}, []string{"plugin"})
	metrics.NewKubeRegistry().MustRegister(gauge)
	w := newWaitGauge(gauge)
	const gce, ebs = "kubernetes.io/gce-pd", "kubernetes.io/aws-ebs"
	a, b, c := state.Key{Volume: "vol-a", Node: "n1"}, state.Key{Volume: "vol-b", Node: "n1"}, state.Key{Volume: "vol-c", Node: "n2"}
	never := state.Key{Volume: "vol-d", Node: "n2"}
	want := func(step string, counts map[string]float64) {
		t.Helper()
		for plugin, n := range counts {
			got, err := testutil.GetGaugeMetricValue(gauge.WithLabelValues(plugin))
			if err != nil {
				t.Fatal(err)
			}
			if got != n {
				t.Errorf("%s: gauge{plugin=%q} = %v, want %v", step, plugin, got, n)
			}
		}
		if len(w.keys) != int(counts[gce]+counts[ebs]) {
			t.Errorf("%s: %d keys tracked, want %v", step, len(w.keys), counts[gce]+counts[ebs])
		}
	}
	w.record(a, gce, true)
	w.record(a, gce, true)
	w.record(b, gce, true)
	w.record(c, ebs, true)
	w.record(never, gce, false) // never waited: nothing changes
	want("three keys wait, one of them twice", map[string]float64{gce: 2, ebs: 1})
	w.record(a, "", false) // the Pod is gone: no plugin known any more
	w.record(c, ebs, false)
	w.record(c, ebs, false)
	want("two keys stop waiting", map[string]float64{gce: 1, ebs: 0})
}
