package runner

// The standard workqueue_* metrics (depth, adds_total,
// queue_duration_seconds, work_duration_seconds, unfinished_work_seconds,
// longest_running_processor_seconds, retries_total, labelled by queue name)
// come from component-base's Prometheus provider, which registers itself as
// client-go's global workqueue metrics provider and into the legacy
// registry when imported. Importing it here rather than in each cmd/ makes
// every Runner queue report them without a wiring step that is easy to
// forget; Options.MetricsProvider overrides it (tests use a private one).
import _ "k8s.io/component-base/metrics/prometheus/workqueue"
