package controller

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/component-base/metrics"
	"k8s.io/utils/clock"

	"github.com/latchcsi/latch/internal/attachdetach/state"
	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// Metric names. The unprefixed ones are kube-controller-manager's, with its
// labels, so that dashboards and alerts written for it keep working
// (test/interop: TestMetrics_latchExposesEveryUpstreamMetricNameAndLabelSet).
const (
	TotalVolumesMetric = "attachdetach_controller_total_volumes"
	// ForcedDetachesMetric is kube-controller-manager's full name (its
	// subsystem attach_detach_controller, then its metric name).
	ForcedDetachesMetric = "attach_detach_controller_attachdetach_controller_forced_detaches"
	// LegacyForcedDetachesMetric is the name latch documented before; it
	// counts the same detaches.
	LegacyForcedDetachesMetric = "attachdetach_controller_forced_detaches"
	// StorageOperationDurationMetric is kube-controller-manager's histogram
	// of its volume_attach and volume_detach operations.
	StorageOperationDurationMetric = "storage_operation_duration_seconds"
	// InUseMetric is kube-controller-manager's count of Pod volumes per
	// node and plugin.
	InUseMetric               = "storage_count_attachable_volumes_in_use"
	OperationDurationMetric   = "latch_attachdetach_operation_duration_seconds"
	PodVolumesAttachedMetric  = "latch_attachdetach_pod_volumes_attached_seconds"
	WaitingForMigrationMetric = "latch_attachdetach_volumes_waiting_for_node_migration"
	// CompetingControllersMetric is 1 while another attach/detach
	// controller was seen writing within the last
	// --coexistence-report-period (coexist.go).
	CompetingControllersMetric = "latch_attachdetach_competing_controllers"
	// MultiAttachWaitingMetric is the number of (volume, node) keys whose
	// attach waits because their exclusive volume is attached to, or
	// being detached from, another node (the Multi-Attach error).
	MultiAttachWaitingMetric = "latch_attachdetach_volumes_waiting_for_multi_attach"
	// CreateErrorsMetric counts the VolumeAttachment creates that failed
	// (createrefused.go).
	CreateErrorsMetric = "latch_attachdetach_volumeattachment_create_errors_total"
)

// Metrics are the controller's own metrics. Unregistered metrics record
// nothing, so tests that do not look at them pass NewMetrics() or nil.
type Metrics struct {
	forcedDetaches     forcedCounters
	operationDuration  *metrics.HistogramVec
	storageOperation   *metrics.HistogramVec
	podVolumesAttached *metrics.Histogram
	// waitingForMigration counts the (volume, node) keys waiting for their
	// node to migrate the volume's in-tree plugin (Config.MigrationByNode).
	waitingForMigration *metrics.GaugeVec
	// waitingForMultiAttach counts the (volume, node) keys whose attach
	// waits for another node to let an exclusive volume go.
	waitingForMultiAttach *metrics.GaugeVec
	totals                *totalsCollector
	competing             *competingGauge
	// createErrors counts failed VolumeAttachment creates by driver and
	// the API server's reason.
	createErrors *metrics.CounterVec
	// attachTimeouts counts attach attempts that timed out (attachwaits.go).
	attachTimeouts *metrics.CounterVec
}

// NewMetrics returns unregistered metrics.
func NewMetrics() *Metrics {
	forced := func(name string) *metrics.CounterVec {
		return metrics.NewCounterVec(&metrics.CounterOpts{
			Name:           name,
			Help:           "Number of times the A/D Controller performed a forced detach",
			StabilityLevel: metrics.ALPHA,
		}, []string{"reason"})
	}
	return &Metrics{
		forcedDetaches: forcedCounters{forced(ForcedDetachesMetric), forced(LegacyForcedDetachesMetric)},
		storageOperation: metrics.NewHistogramVec(&metrics.HistogramOpts{
			Name:           StorageOperationDurationMetric,
			Help:           "Storage operation duration",
			Buckets:        []float64{.1, .25, .5, 1, 2.5, 5, 10, 15, 25, 50, 120, 300, 600},
			StabilityLevel: metrics.ALPHA,
		}, []string{"volume_plugin", "operation_name", "status", "migrated"}),
		operationDuration: metrics.NewHistogramVec(&metrics.HistogramOpts{
			Name:           OperationDurationMetric,
			Help:           "Seconds from creating a VolumeAttachment to seeing it attached (operation=attach), or from deleting it to seeing it gone (operation=detach).",
			Buckets:        []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600},
			StabilityLevel: metrics.ALPHA,
		}, []string{"operation", "driver"}),
		podVolumesAttached: metrics.NewHistogram(&metrics.HistogramOpts{
			Name:           PodVolumesAttachedMetric,
			Help:           "Seconds from a Pod being scheduled to all its attachable volumes being attached.",
			Buckets:        []float64{0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600},
			StabilityLevel: metrics.ALPHA,
		}),
		waitingForMigration: metrics.NewGaugeVec(&metrics.GaugeOpts{
			Name:           WaitingForMigrationMetric,
			Help:           "Number of (volume, node) pairs not attached because the node's CSINode does not list the volume's in-tree plugin in its migrated-plugins annotation (--csi-migration-by-node).",
			StabilityLevel: metrics.ALPHA,
		}, []string{"plugin"}),
		waitingForMultiAttach: metrics.NewGaugeVec(&metrics.GaugeOpts{
			Name:           MultiAttachWaitingMetric,
			Help:           "Number of (volume, node) pairs wanted by a Pod but not attached because the volume is exclusive (ReadWriteOnce, ReadWriteOncePod or a single-node CSI capability) and attached to, or still being detached from, another node: the Pods got kube-controller-manager's Multi-Attach error.",
			StabilityLevel: metrics.ALPHA,
		}, []string{"driver"}),
		totals: &totalsCollector{
			desc: metrics.NewDesc(TotalVolumesMetric, "Number of volumes in A/D Controller",
				[]string{"plugin_name", "state"}, nil, metrics.ALPHA, ""),
			inUse: metrics.NewDesc(InUseMetric, "Measure number of volumes in use",
				[]string{"node", "volume_plugin"}, nil, metrics.ALPHA, ""),
		},
		createErrors: metrics.NewCounterVec(&metrics.CounterOpts{
			Name:           CreateErrorsMetric,
			Help:           "VolumeAttachment creates of the attach/detach controller that failed, by driver and by the reason of the API server's answer (Invalid: a ValidatingAdmissionPolicy denied it, unless the policy names another reason; Forbidden: RBAC or an admission webhook refused it; Unknown: no answer, e.g. a timeout). Each is retried with backoff.",
			StabilityLevel: metrics.ALPHA,
		}, []string{"driver", "reason"}),
		attachTimeouts: newAttachTimeoutsCounter(),
		competing: &competingGauge{desc: metrics.NewDesc(CompetingControllersMetric,
			"1 while another attach/detach controller (a field manager other than latch's) was seen creating VolumeAttachments or changing a node's status.volumesAttached within the last --coexistence-report-period, else 0.",
			nil, nil, metrics.ALPHA, "")},
	}
}

// forcedCounters counts a forced detach under kube-controller-manager's
// name and under the name latch documented first.
type forcedCounters [2]*metrics.CounterVec

// WithLabelValues returns the reason's counters, incremented together.
func (f forcedCounters) WithLabelValues(reason string) interface{ Inc() } {
	return bothCounters{f[0].WithLabelValues(reason), f[1].WithLabelValues(reason)}
}

type bothCounters [2]metrics.CounterMetric

func (b bothCounters) Inc() {
	b[0].Inc()
	b[1].Inc()
}

// Registry is where metrics go: a metrics.KubeRegistry of the rig, or
// the binary's adapter of component-base's global registry. This package
// registers nothing anywhere by itself.
type Registry interface {
	MustRegister(...metrics.Registerable)
	CustomMustRegister(...metrics.StableCollector)
}

// Register registers the metrics with r.
func (m *Metrics) Register(r Registry) {
	r.MustRegister(m.forcedDetaches[0], m.forcedDetaches[1], m.operationDuration, m.storageOperation, m.podVolumesAttached, m.waitingForMigration, m.waitingForMultiAttach, m.createErrors, m.attachTimeouts)
	r.CustomMustRegister(m.totals, m.competing)
}

func (m *Metrics) setSource(c *Controller) {
	m.totals.source.Store(c)
	if c.timing != nil {
		c.timing.migratedOf = func(key state.Key) bool {
			a, ok := c.asw.Get(key)
			return ok && a.Spec != nil && a.Spec.MigratedFrom != ""
		}
	}
}

// totalsCollector computes attachdetach_controller_total_volumes and
// storage_count_attachable_volumes_in_use at scrape time from the two
// caches, as upstream does.
type totalsCollector struct {
	metrics.BaseStableCollector
	desc  *metrics.Desc
	inUse *metrics.Desc
	// source is the controller the caches are read from; nil until New
	// set it (a scrape before reports nothing).
	source atomic.Pointer[Controller]
}

var _ metrics.StableCollector = (*totalsCollector)(nil)

func (t *totalsCollector) DescribeWithStability(ch chan<- *metrics.Desc) {
	ch <- t.desc
	ch <- t.inUse
}

func (t *totalsCollector) CollectWithStability(ch chan<- metrics.Metric) {
	c := t.source.Load()
	if c == nil {
		return
	}
	desired := map[string]int{}
	// inUse counts, per node and plugin, the Pods' uses of the volumes
	// wanted there (kube-controller-manager counts each Pod volume).
	type nodePlugin struct{ node, plugin string }
	inUse := map[nodePlugin]int{}
	nodes, err := c.nodeLister.List(everything())
	if err == nil {
		for _, n := range nodes {
			for _, w := range c.dsw.VolumesOnNode(n.Name) {
				plugin := pluginName(w.Volume.UniqueName)
				desired[plugin]++
				inUse[nodePlugin{n.Name, plugin}] += len(w.Pods)
			}
		}
	}
	for k, n := range inUse {
		if n > 0 {
			ch <- metrics.NewLazyConstMetric(t.inUse, metrics.GaugeValue, float64(n), k.node, k.plugin)
		}
	}
	actual := map[string]int{}
	for _, k := range c.asw.Keys() {
		actual[pluginName(k.Volume)]++
	}
	for plugin, n := range desired {
		ch <- metrics.NewLazyConstMetric(t.desc, metrics.GaugeValue, float64(n), plugin, "desired_state_of_world")
	}
	for plugin, n := range actual {
		ch <- metrics.NewLazyConstMetric(t.desc, metrics.GaugeValue, float64(n), plugin, "actual_state_of_world")
	}
}

// pluginName is upstream's fully qualified plugin name for a CSI volume,
// "kubernetes.io/csi:<driver>".
func pluginName(vol v1.UniqueVolumeName) string {
	driver, _, err := kubenames.ParseUniqueVolumeName(string(vol))
	if err != nil {
		return strings.TrimSuffix(kubenames.UniqueVolumeNamePrefix, "/")
	}
	return strings.TrimSuffix(kubenames.UniqueVolumeNamePrefix, "/") + ":" + driver
}

// competingGauge computes latch_attachdetach_competing_controllers at
// scrape time from the time of the last evidence.
type competingGauge struct {
	metrics.BaseStableCollector
	desc   *metrics.Desc
	mu     sync.Mutex
	period time.Duration
	clock  clock.PassiveClock
	last   time.Time
}

var _ metrics.StableCollector = (*competingGauge)(nil)

func (g *competingGauge) setPeriod(period time.Duration, clk clock.PassiveClock) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.period, g.clock = period, clk
}

func (g *competingGauge) detected(at time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.last = at
}

func (g *competingGauge) DescribeWithStability(ch chan<- *metrics.Desc) { ch <- g.desc }

func (g *competingGauge) CollectWithStability(ch chan<- metrics.Metric) {
	g.mu.Lock()
	v := 0.0
	if !g.last.IsZero() && g.clock != nil && g.clock.Since(g.last) < g.period {
		v = 1
	}
	g.mu.Unlock()
	ch <- metrics.NewLazyConstMetric(g.desc, metrics.GaugeValue, v)
}
