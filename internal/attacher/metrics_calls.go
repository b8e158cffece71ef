package attacher

import (
	"k8s.io/component-base/metrics"

	"github.com/latchcsi/latch/internal/adaptive"
)

// The gauges of the calls waiting for a CSI call slot, computed at scrape
// time from the limit of calls in flight.
const (
	callsWaitingMetricName = "latch_attacher_driver_calls_waiting"
	callOldestWaitName     = "latch_attacher_driver_call_oldest_wait_seconds"
)

// callWaitCollector reports, per operation (attach, detach), how many
// ControllerPublish and ControllerUnpublish calls wait for a slot under
// the limit and how long the oldest has waited. These VolumeAttachments
// are held by a worker, so the workqueue's depth and age do not show them.
type callWaitCollector struct {
	metrics.BaseStableCollector

	waiting, oldest *metrics.Desc
	calls           *adaptive.Limiter
}

var _ metrics.StableCollector = (*callWaitCollector)(nil)

func newCallWaitCollector(calls *adaptive.Limiter) *callWaitCollector {
	return &callWaitCollector{
		waiting: metrics.NewDesc(callsWaitingMetricName,
			"ControllerPublish (operation=attach) and ControllerUnpublish (operation=detach) calls waiting for a slot under the limit of driver calls in flight (latch_attacher_driver_concurrency_limit).",
			[]string{"operation"}, nil, metrics.ALPHA, ""),
		oldest: metrics.NewDesc(callOldestWaitName,
			"Seconds the oldest ControllerPublish (operation=attach) or ControllerUnpublish (operation=detach) call waiting for a slot under the limit of driver calls in flight has waited; 0 when none waits.",
			[]string{"operation"}, nil, metrics.ALPHA, ""),
		calls: calls,
	}
}

func (c *callWaitCollector) DescribeWithStability(ch chan<- *metrics.Desc) {
	ch <- c.waiting
	ch <- c.oldest
}

func (c *callWaitCollector) CollectWithStability(ch chan<- metrics.Metric) {
	for _, dir := range []adaptive.Direction{adaptive.Attach, adaptive.Detach} {
		n, oldest := c.calls.Waiting(dir)
		if m := metrics.NewLazyConstMetric(c.waiting, metrics.GaugeValue, float64(n), dir.String()); m != nil {
			ch <- m
		}
		if m := metrics.NewLazyConstMetric(c.oldest, metrics.GaugeValue, oldest.Seconds(), dir.String()); m != nil {
			ch <- m
		}
	}
}

// CallWaitCollector reports the calls waiting for a CSI call slot
// (latch_attacher_driver_calls_waiting and
// latch_attacher_driver_call_oldest_wait_seconds); register it with a
// registry's CustomRegister.
func (c *Controller) CallWaitCollector() metrics.StableCollector {
	return newCallWaitCollector(c.exec.calls)
}
