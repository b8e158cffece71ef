package runner

import (
	"sync"
	"time"

	"k8s.io/client-go/util/workqueue"
	"k8s.io/component-base/metrics"
	"k8s.io/utils/clock"
)

// timedFIFO is the ready-item store under the Runner's workqueue. It
// behaves like workqueue's default FIFO but remembers when each item
// became ready, so the age of the oldest waiting item, the one number that
// tells whether workers keep up, costs one lock and one subtraction.
//
// It has two lanes. Items go to the first, in readiness order; an item
// marked by markLater (Runner.EnqueueLater) goes to the second, which Pop
// serves only when the first is empty. A plain add of an item waiting in
// the second lane moves it to the first. The lanes order work, nothing
// more: every item pushed is popped once, whatever its lane.
//
// Push, Pop, Len and Touch are called by workqueue with its own lock held;
// mu protects the lanes and marks against OldestAge (a metrics scrape) and
// markLater/unmark (Runner's callers), which run without it.
type timedFIFO[K comparable] struct {
	clock clock.PassiveClock

	mu sync.Mutex
	// items is in readiness order: items[0] has waited longest.
	items []timedItem[K]
	// later is the second lane, in readiness order; inLater says which
	// keys are in it.
	later   []timedItem[K]
	inLater map[K]int
	// laterPopped is how many items have left the second lane's front:
	// inLater[key] - laterPopped is key's place in later, so that a plain
	// add finds it without walking the lane (at a start the lane holds
	// every settled key).
	laterPopped int
	// marks are the keys whose next Push (or Touch) comes from
	// EnqueueLater.
	marks map[K]struct{}
	// inLaterPeak and marksPeak are the most keys each map held since it
	// was last made anew: Go's maps keep their tables when emptied, so a
	// map that grew past shrinkAbove is replaced once it is empty again.
	inLaterPeak, marksPeak int
}

// shrinkAbove is the size past which an emptied map of timedFIFO is
// replaced by a new one. A controller's start enqueues every settled key
// at once (Runner.EnqueueLater): at 100,000 volumes the lanes' storage
// would otherwise stay sized for the whole cluster while the queue is
// empty, which it is nearly always after the start.
const shrinkAbove = 1024

type timedItem[K comparable] struct {
	key   K
	ready time.Time
	// moved says the item left the second lane for the first: Pop skips
	// its entry there.
	moved bool
}

var _ workqueue.Queue[string] = (*timedFIFO[string])(nil)

func newTimedFIFO[K comparable](c clock.PassiveClock) *timedFIFO[K] {
	return &timedFIFO[K]{clock: c, inLater: map[K]int{}, marks: map[K]struct{}{}}
}

// markLater says the next add of key is a low-priority one.
func (q *timedFIFO[K]) markLater(key K) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.marks[key] = struct{}{}
	q.marksPeak = max(q.marksPeak, len(q.marks))
}

// unmark says the next add of key is a plain one.
func (q *timedFIFO[K]) unmark(key K) {
	q.mu.Lock()
	defer q.mu.Unlock()
	deleteShrinking(&q.marks, &q.marksPeak, key)
}

// deleteShrinking deletes key from *m and, when that empties a map that
// held more than shrinkAbove keys (*peak), replaces it with a new one.
func deleteShrinking[K comparable, V any](m *map[K]V, peak *int, key K) {
	delete(*m, key)
	if len(*m) == 0 && *peak > shrinkAbove {
		*m, *peak = map[K]V{}, 0
	}
}

// Touch is called when a queued item is added again. An item in the first
// lane keeps its place and timestamp (it has been waiting since the first
// add). A plain add of an item in the second lane moves it to the end of
// the first, with its timestamp; a low-priority add leaves it where it is.
func (q *timedFIFO[K]) Touch(key K) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if _, marked := q.marks[key]; marked {
		deleteShrinking(&q.marks, &q.marksPeak, key)
		return
	}
	at, ok := q.inLater[key]
	if !ok {
		return
	}
	it := &q.later[at-q.laterPopped]
	it.moved = true
	q.items = append(q.items, timedItem[K]{key: key, ready: it.ready})
	deleteShrinking(&q.inLater, &q.inLaterPeak, key)
}

func (q *timedFIFO[K]) Push(key K) {
	now := q.clock.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	if _, marked := q.marks[key]; marked {
		deleteShrinking(&q.marks, &q.marksPeak, key)
		q.inLater[key] = q.laterPopped + len(q.later)
		q.later = append(q.later, timedItem[K]{key: key, ready: now})
		q.inLaterPeak = max(q.inLaterPeak, len(q.inLater))
		return
	}
	q.items = append(q.items, timedItem[K]{key: key, ready: now})
}

func (q *timedFIFO[K]) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items) + len(q.inLater)
}

func (q *timedFIFO[K]) Pop() K {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.items) > 0 {
		head := q.items[0]
		q.items[0] = timedItem[K]{} // let the key be collected
		q.items = emptiedToNil(q.items[1:])
		return head.key
	}
	for {
		head := q.later[0]
		q.later[0] = timedItem[K]{}
		q.later = emptiedToNil(q.later[1:])
		q.laterPopped++
		if !head.moved {
			deleteShrinking(&q.inLater, &q.inLaterPeak, head.key)
			return head.key
		}
	}
}

// emptiedToNil lets an emptied lane's backing array go: popping slices the
// lane from the front, so an empty lane would still hold the whole array
// of its largest backlog.
func emptiedToNil[K comparable](lane []timedItem[K]) []timedItem[K] {
	if len(lane) == 0 {
		return nil
	}
	return lane
}

// OldestAge returns how long the oldest ready item (of either lane) has
// been waiting for a worker, or 0 when none is waiting. Items waiting out a
// backoff or a RequeueAfter are not ready and do not count.
func (q *timedFIFO[K]) OldestAge() time.Duration {
	q.mu.Lock()
	defer q.mu.Unlock()
	var oldest time.Time
	if len(q.items) > 0 {
		oldest = q.items[0].ready
	}
	for _, it := range q.later {
		if !it.moved {
			if oldest.IsZero() || it.ready.Before(oldest) {
				oldest = it.ready
			}
			break
		}
	}
	if oldest.IsZero() {
		return 0
	}
	return q.clock.Since(oldest)
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
