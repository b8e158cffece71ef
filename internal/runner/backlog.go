package runner

import (
	"sync"
	"time"

	"k8s.io/client-go/util/workqueue"
	"k8s.io/component-base/metrics"
	"k8s.io/utils/clock"
)

// timedFIFO is the ready-item store under the Runner's workqueue. It
// behaves exactly like workqueue's default FIFO but remembers when each item
// became ready, so the age of the oldest waiting item, the one number that
// tells whether workers keep up, costs one lock and one subtraction.
//
// Push, Pop, Len and Touch are called by workqueue with its own lock held;
// mu only protects against OldestAge, which a metrics scrape calls from
// another goroutine.
type timedFIFO[K comparable] struct {
	clock clock.PassiveClock

	mu sync.Mutex
	// items is in readiness order: items[0] has waited longest.
	items []timedItem[K]
}

type timedItem[K comparable] struct {
	key   K
	ready time.Time
}

var _ workqueue.Queue[string] = (*timedFIFO[string])(nil)

func newTimedFIFO[K comparable](c clock.PassiveClock) *timedFIFO[K] {
	return &timedFIFO[K]{clock: c}
}

// Touch is called when a queued item is added again. The item keeps its
// place and its timestamp: it has been waiting since the first add.
func (q *timedFIFO[K]) Touch(K) {}

func (q *timedFIFO[K]) Push(key K) {
	now := q.clock.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	q.items = append(q.items, timedItem[K]{key: key, ready: now})
}

func (q *timedFIFO[K]) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items)
}

func (q *timedFIFO[K]) Pop() K {
	q.mu.Lock()
	defer q.mu.Unlock()
	head := q.items[0]
	q.items[0] = timedItem[K]{} // let the key be collected
	q.items = q.items[1:]
	return head.key
}

// OldestAge returns how long the oldest ready item has been waiting for a
// worker, or 0 when none is waiting. Items waiting out a backoff or a
// RequeueAfter are not ready and do not count.
func (q *timedFIFO[K]) OldestAge() time.Duration {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.items) == 0 {
		return 0
	}
	return q.clock.Since(q.items[0].ready)
}

// OldestItemAgeMetricName is the name of the backlog age gauge. It has one
// label, name, with the queue name (same label as the standard workqueue_*
// metrics). The value is the number of seconds the oldest item that is
// ready to be processed has been waiting for a worker; 0 when the queue is
// empty. workqueue_depth says how many items wait, this says for how long:
// a steadily growing value means workers do not keep up (or are stuck),
// which workqueue_queue_duration_seconds only shows after the fact.
const OldestItemAgeMetricName = "latch_workqueue_oldest_item_age_seconds"

// backlogCollector reports OldestItemAgeMetricName for one queue, computed
// at scrape time. The queue name is a constant label so that the
// collectors of several runners can live in one registry.
type backlogCollector struct {
	metrics.BaseStableCollector

	desc *metrics.Desc
	age  func() time.Duration
}

var _ metrics.StableCollector = (*backlogCollector)(nil)

func newBacklogCollector(queueName string, age func() time.Duration) *backlogCollector {
	return &backlogCollector{
		desc: metrics.NewDesc(OldestItemAgeMetricName,
			"Seconds the oldest item ready for processing has been waiting in the workqueue; 0 when empty.",
			nil, metrics.Labels{"name": queueName}, metrics.ALPHA, ""),
		age: age,
	}
}

func (c *backlogCollector) DescribeWithStability(ch chan<- *metrics.Desc) {
	ch <- c.desc
}

func (c *backlogCollector) CollectWithStability(ch chan<- metrics.Metric) {
	if m := metrics.NewLazyConstMetric(c.desc, metrics.GaugeValue, c.age().Seconds()); m != nil {
		ch <- m
	}
}
