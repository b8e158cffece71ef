package runner

import (
	"k8s.io/client-go/util/workqueue"
	"k8s.io/component-base/metrics"
)

// QueueMetrics are the standard workqueue_* metrics (depth, adds_total,
// queue_duration_seconds, work_duration_seconds, unfinished_work_seconds,
// longest_running_processor_seconds, retries_total, labelled by queue
// name), with the names, help, buckets and stability kube-controller-manager
// and upstream's sidecars export them under (component-base's Prometheus
// workqueue provider). They are a workqueue.MetricsProvider for
// Options.MetricsProvider, handed down by the binary that registered them
// (Register): the runner registers nothing and sets no process-wide
// provider. One QueueMetrics serves every queue of a process, each under
// its own name label; registering it is the binary's, once per registry.
type QueueMetrics struct {
	depth, unfinished, longestRunning *metrics.GaugeVec
	adds, retries                     *metrics.CounterVec
	latency, workDuration             *metrics.HistogramVec
}

var _ workqueue.MetricsProvider = (*QueueMetrics)(nil)

// NewQueueMetrics makes the workqueue_* metrics. Until they are registered
// (Register) what queues record is dropped, so register them before the
// queues are made.
func NewQueueMetrics() *QueueMetrics {
	const subsystem = "workqueue"
	buckets := metrics.ExponentialBuckets(10e-9, 10, 10)
	gauge := func(name, help string) *metrics.GaugeVec {
		return metrics.NewGaugeVec(&metrics.GaugeOpts{Subsystem: subsystem, Name: name, Help: help, StabilityLevel: metrics.BETA}, []string{"name"})
	}
	counter := func(name, help string) *metrics.CounterVec {
		return metrics.NewCounterVec(&metrics.CounterOpts{Subsystem: subsystem, Name: name, Help: help, StabilityLevel: metrics.BETA}, []string{"name"})
	}
	histogram := func(name, help string) *metrics.HistogramVec {
		return metrics.NewHistogramVec(&metrics.HistogramOpts{Subsystem: subsystem, Name: name, Help: help, Buckets: buckets, StabilityLevel: metrics.BETA}, []string{"name"})
	}
	return &QueueMetrics{
		depth:        gauge("depth", "Current depth of workqueue"),
		adds:         counter("adds_total", "Total number of adds handled by workqueue"),
		latency:      histogram("queue_duration_seconds", "How long in seconds an item stays in workqueue before being requested."),
		workDuration: histogram("work_duration_seconds", "How long in seconds processing an item from workqueue takes."),
		unfinished: gauge("unfinished_work_seconds", "How many seconds of work has done that is in progress and hasn't been observed by work_duration. "+
			"Large values indicate stuck threads. One can deduce the number of stuck threads by observing the rate at which this increases."),
		longestRunning: gauge("longest_running_processor_seconds", "How many seconds has the longest running processor for workqueue been running."),
		retries:        counter("retries_total", "Total number of retries handled by workqueue"),
	}
}

// Register registers the metrics with register (a KubeRegistry's
// MustRegister: the binary's registry).
func (m *QueueMetrics) Register(register func(...metrics.Registerable)) {
	register(m.depth, m.adds, m.latency, m.workDuration, m.unfinished, m.longestRunning, m.retries)
}

func (m *QueueMetrics) NewDepthMetric(name string) workqueue.GaugeMetric {
	return m.depth.WithLabelValues(name)
}

func (m *QueueMetrics) NewAddsMetric(name string) workqueue.CounterMetric {
	return m.adds.WithLabelValues(name)
}

func (m *QueueMetrics) NewLatencyMetric(name string) workqueue.HistogramMetric {
	return m.latency.WithLabelValues(name)
}

func (m *QueueMetrics) NewWorkDurationMetric(name string) workqueue.HistogramMetric {
	return m.workDuration.WithLabelValues(name)
}

func (m *QueueMetrics) NewUnfinishedWorkSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return m.unfinished.WithLabelValues(name)
}

func (m *QueueMetrics) NewLongestRunningProcessorSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return m.longestRunning.WithLabelValues(name)
}

func (m *QueueMetrics) NewRetriesMetric(name string) workqueue.CounterMetric {
	return m.retries.WithLabelValues(name)
}
