package attacher

import (
	"errors"
	"testing"
	"time"

	csimetrics "github.com/kubernetes-csi/csi-lib-utils/metrics"
	"github.com/prometheus/client_golang/prometheus"
)

// migratedLabels gathers m's csi_sidecar_operations_seconds and returns,
// per driver_name, whether its series carry the migrated label.
func migratedLabels(t *testing.T, m *csiOpsMetrics) map[string]bool {
	t.Helper()
	mfs, err := m.GetRegistry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, mf := range mfs {
		if mf.GetName() != "csi_sidecar_operations_seconds" {
			continue
		}
		for _, metric := range mf.GetMetric() {
			var driver string
			has := false
			for _, l := range metric.GetLabel() {
				switch l.GetName() {
				case "driver_name":
					driver = l.GetValue()
				case "migrated":
					has = true
				}
			}
			out[driver] = has
		}
	}
	return out
}

func TestCSIOpsMetrics_migratedLabelOnlyForTheDriverOfAMigratedPlugin(t *testing.T) {
	for _, tc := range []struct {
		driver   string
		migrated bool
	}{
		{"mock.csi.latch.dev", false},
		{"pd.csi.storage.gke.io", true}, // kubernetes.io/gce-pd's CSI driver
	} {
		m := newCSIOpsMetrics(prometheus.NewRegistry())
		m.RecordMetrics("/csi.v1.Identity/Probe", nil, time.Millisecond) // before the driver named itself
		m.SetDriverName(tc.driver)
		if m.HaveAdditionalLabel("migrated") != tc.migrated {
			t.Errorf("%s: HaveAdditionalLabel(migrated) = %v, want %v", tc.driver, !tc.migrated, tc.migrated)
		}
		// What connection's interceptor does for each call.
		var rec csimetrics.CSIMetricsManager = m
		if rec.HaveAdditionalLabel("migrated") {
			var err error
			if rec, err = rec.WithLabelValues(map[string]string{"migrated": "true"}); err != nil {
				t.Fatal(err)
			}
		}
		rec.RecordMetrics("/csi.v1.Controller/ControllerPublishVolume", errors.New("x"), time.Millisecond)
		got := migratedLabels(t, m)
		if has, ok := got[tc.driver]; !ok || has != tc.migrated {
			t.Errorf("%s: series with migrated label = %v (found %v), want %v; all %v", tc.driver, has, ok, tc.migrated, got)
		}
		if tc.migrated {
			continue
		}
		if has, ok := got["unknown-driver"]; !ok || has {
			t.Errorf("the Probe before the driver's name: recorded %v, migrated label %v; want recorded under unknown-driver without it", ok, has)
		}
	}
}
