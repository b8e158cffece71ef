package attacher

import (
	"sync/atomic"
	"time"

	csimetrics "github.com/kubernetes-csi/csi-lib-utils/metrics"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/component-base/metrics"
	csitrans "k8s.io/csi-translation-lib"
)

// csiOpsMetrics records csi_sidecar_operations_seconds as external-attacher
// does: with the migrated label only when the driver is the CSI driver of
// a migrated in-tree plugin. Which one is known only once the driver named
// itself (SetDriverName), after the first calls (Probe, GetPluginInfo):
// those go to the manager without the label under "unknown-driver", as
// upstream's first manager records them, and only the chosen manager is
// served.
type csiOpsMetrics struct {
	plain, migrated csimetrics.CSIMetricsManager
	chosen          atomic.Pointer[csimetrics.CSIMetricsManager]
	isMigrated      func(driver string) bool
}

var _ csimetrics.CSIMetricsManager = (*csiOpsMetrics)(nil)

// newCSIOpsMetrics returns the managers, each serving extra (the legacy
// registry) besides its own registry.
func newCSIOpsMetrics(extra prometheus.Gatherer) *csiOpsMetrics {
	m := &csiOpsMetrics{
		plain:      csimetrics.NewCSIMetricsManagerWithOptions("", csimetrics.WithSubsystem(csimetrics.SubsystemSidecar)).WithAdditionalRegistry(extra),
		migrated:   csimetrics.NewCSIMetricsManagerWithOptions("", csimetrics.WithSubsystem(csimetrics.SubsystemSidecar), csimetrics.WithMigration()).WithAdditionalRegistry(extra),
		isMigrated: csitrans.New().IsMigratedCSIDriverByName,
	}
	m.chosen.Store(&m.plain)
	return m
}

func (m *csiOpsMetrics) current() csimetrics.CSIMetricsManager { return *m.chosen.Load() }

// SetDriverName names the driver and chooses the manager for it.
func (m *csiOpsMetrics) SetDriverName(driver string) {
	m.plain.SetDriverName(driver)
	m.migrated.SetDriverName(driver)
	if m.isMigrated(driver) {
		m.chosen.Store(&m.migrated)
	} else {
		m.chosen.Store(&m.plain)
	}
}

func (m *csiOpsMetrics) GetRegistry() metrics.KubeRegistry { return m.current().GetRegistry() }

func (m *csiOpsMetrics) RecordMetrics(op string, err error, d time.Duration) {
	m.current().RecordMetrics(op, err, d)
}

func (m *csiOpsMetrics) WithLabelValues(labels map[string]string) (csimetrics.CSIMetricsManager, error) {
	return m.current().WithLabelValues(labels)
}

func (m *csiOpsMetrics) HaveAdditionalLabel(name string) bool {
	return m.current().HaveAdditionalLabel(name)
}

// WithAdditionalRegistry adds registry to both managers.
func (m *csiOpsMetrics) WithAdditionalRegistry(registry prometheus.Gatherer) csimetrics.CSIMetricsManager {
	m.plain.WithAdditionalRegistry(registry)
	m.migrated.WithAdditionalRegistry(registry)
	return m
}

// RegisterToServer serves the manager chosen by then: call it after
// SetDriverName.
func (m *csiOpsMetrics) RegisterToServer(s csimetrics.Server, path string) {
	m.current().RegisterToServer(s, path)
}

func (m *csiOpsMetrics) RegisterPprofToServer(s csimetrics.Server) {
	m.current().RegisterPprofToServer(s)
}
