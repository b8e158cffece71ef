package attacher

import (
	"time"

	"k8s.io/component-base/metrics"

	"github.com/latchcsi/latch/internal/app"
)

// Metrics are the attacher's own metrics, on top of csi-lib-utils'
// csi_sidecar_operations_seconds and the workqueue metrics.
type Metrics struct {
	attachLatency *metrics.Histogram
	csiErrors     *metrics.CounterVec
	repairs       *metrics.CounterVec
	// listAborted: ListVolumes listings given up before the driver ended
	// them, by reason (reconcile.go).
	listAborted *metrics.CounterVec
	// orphans and orphanRecordErrors: publications left by deleted or
	// replaced VolumeAttachments (orphans.go).
	orphans            *metrics.Gauge
	orphanRecordErrors *metrics.CounterVec
	// orphanRecordUnavailable is 1 while the last read or write of the
	// orphan record failed (orphanrecord.go).
	orphanRecordUnavailable *metrics.Gauge
	// driverLimit is the limit of CSI calls in flight; driverThrottled
	// counts the calls the backend pushed back on (executor_steps.go).
	driverLimit     *metrics.Gauge
	driverThrottled *metrics.CounterVec
	// competing is 1 while this attacher, without leader election, sees
	// another identity hold its Lease (app.Presence.Competing).
	competing *metrics.Gauge
}

// NewMetrics creates the metrics; register them with Register.
func NewMetrics() *Metrics {
	return &Metrics{
		attachLatency: metrics.NewHistogram(&metrics.HistogramOpts{
			Name:           "latch_attacher_attach_latency_seconds",
			Help:           "Time from VolumeAttachment creation to status.attached=true written by this attacher.",
			Buckets:        []float64{.05, .1, .25, .5, 1, 2, 5, 10, 30, 60, 300, 900},
			StabilityLevel: metrics.ALPHA,
		}),
		csiErrors: metrics.NewCounterVec(&metrics.CounterOpts{
			Name:           "latch_attacher_csi_errors_total",
			Help:           "Failed ControllerPublish (operation=attach) and ControllerUnpublish (operation=detach) calls by gRPC code.",
			StabilityLevel: metrics.ALPHA,
		}, []string{"operation", "code"}),
		repairs: metrics.NewCounterVec(&metrics.CounterOpts{
			Name:           "latch_attacher_reconcile_repairs_total",
			Help:           "VolumeAttachments the ListVolumes reconciler found out of sync with the driver, by action (republish or unpublish).",
			StabilityLevel: metrics.ALPHA,
		}, []string{"action"}),
		listAborted: metrics.NewCounterVec(&metrics.CounterOpts{
			Name:           "latch_attacher_listvolumes_aborted_total",
			Help:           "ListVolumes reconciles given up before the driver ended the listing, by reason: page_budget (a next_token on every page up to --reconcile-max-pages) or repeated_token (a next_token the driver had returned before).",
			StabilityLevel: metrics.ALPHA,
		}, []string{"reason"}),
		orphans: metrics.NewGauge(&metrics.GaugeOpts{
			Name:           "latch_attacher_orphaned_publications",
			Help:           "Publications left behind by VolumeAttachments deleted or replaced while the driver published them, not yet unpublished.",
			StabilityLevel: metrics.ALPHA,
		}),
		orphanRecordErrors: metrics.NewCounterVec(&metrics.CounterOpts{
			Name:           "latch_attacher_orphan_record_errors_total",
			Help:           "Failed reads, writes and watches of the ConfigMap recording orphaned publications, by operation (load, put, delete, watch).",
			StabilityLevel: metrics.ALPHA,
		}, []string{"operation"}),
		orphanRecordUnavailable: metrics.NewGauge(&metrics.GaugeOpts{
			Name:           "latch_attacher_orphan_record_unavailable",
			Help:           "1 while the last read, write or watch of the ConfigMap recording orphaned publications failed: orphans are then tracked in memory only, and a restart loses them.",
			StabilityLevel: metrics.ALPHA,
		}),
		driverLimit: metrics.NewGauge(&metrics.GaugeOpts{
			Name:           "latch_attacher_driver_concurrency_limit",
			Help:           "The most ControllerPublish and ControllerUnpublish calls allowed in flight at once now, attaches and detaches together: it follows the backend with --driver-concurrency=adaptive (at most --worker-threads), else it is --worker-threads.",
			StabilityLevel: metrics.ALPHA,
		}),
		driverThrottled: metrics.NewCounterVec(&metrics.CounterOpts{
			Name:           "latch_attacher_driver_throttled_total",
			Help:           "ControllerPublish (operation=attach) and ControllerUnpublish (operation=detach) calls the driver answered with ResourceExhausted or Unavailable: the backend pushing back. Each lowers the adaptive limit (at most once per backend latency) and is retried without growing the VolumeAttachment's backoff.",
			StabilityLevel: metrics.ALPHA,
		}, []string{"operation"}),
		competing: metrics.NewGauge(&metrics.GaugeOpts{
			Name:           "latch_attacher_competing_instances",
			Help:           "1 while this csi-attacher, running without --leader-election, sees another identity hold its driver's Lease and therefore does no work; 0 otherwise.",
			StabilityLevel: metrics.ALPHA,
		}),
	}
}

// Register registers the metrics with register (for example
// legacyregistry.MustRegister or a test registry's MustRegister).
func (m *Metrics) Register(register func(...metrics.Registerable)) {
	register(m.attachLatency, m.csiErrors, m.repairs, m.listAborted, m.orphans, m.orphanRecordErrors, m.orphanRecordUnavailable, m.driverLimit, m.driverThrottled, m.competing)
}

// competingGauge is latch_attacher_competing_instances for app.Presence
// (nil without metrics: nothing recorded).
func (m *Metrics) competingGauge() app.GaugeSetter {
	if m == nil {
		return nil
	}
	return m.competing
}

func (m *Metrics) attached(created, now time.Time) {
	if m == nil || created.IsZero() {
		return
	}
	m.attachLatency.Observe(now.Sub(created).Seconds())
}

func (m *Metrics) csiError(op string, err error) {
	if m == nil {
		return
	}
	code, ok := grpcCode(err)
	label := code.String()
	if !ok {
		label = "NotGRPC"
	}
	m.csiErrors.WithLabelValues(op, label).Inc()
}

// driverLimitIs shows the limit of CSI calls in flight.
func (m *Metrics) driverLimitIs(n int) {
	if m == nil {
		return
	}
	m.driverLimit.Set(float64(n))
}

// throttled counts a call the backend pushed back on.
func (m *Metrics) throttled(op string) {
	if m == nil {
		return
	}
	m.driverThrottled.WithLabelValues(op).Inc()
}

func (m *Metrics) repaired(action string) {
	if m == nil {
		return
	}
	m.repairs.WithLabelValues(action).Inc()
}

func (m *Metrics) listVolumesAborted(reason string) {
	if m != nil {
		m.listAborted.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) orphanAdded() {
	if m != nil {
		m.orphans.Inc()
	}
}

func (m *Metrics) orphanDropped() {
	if m != nil {
		m.orphans.Dec()
	}
}

func (m *Metrics) orphanRecordError(op string) {
	if m != nil {
		m.orphanRecordErrors.WithLabelValues(op).Inc()
	}
}

func (m *Metrics) orphanRecordAvailable(ok bool) {
	if m == nil {
		return
	}
	if ok {
		m.orphanRecordUnavailable.Set(0)
	} else {
		m.orphanRecordUnavailable.Set(1)
	}
}

// Queue names: the name label of the workqueue_* metrics. External-attacher
// has one VolumeAttachment queue, "csi-attacher-va", and "csi-attacher-pv";
// latch gives attaches and detaches a queue each, so that a burst of one
// cannot starve the other. The attach queue keeps upstream's name; the
// selector name=~"csi-attacher-va.*" sums both as upstream's one queue
// (docs/metrics.md).
const (
	AttachQueueName = "csi-attacher-va"
	DetachQueueName = "csi-attacher-va-detach"
	PVQueueName     = "csi-attacher-pv"
)
