package controller

import (
	"sync"
	"time"

	"k8s.io/component-base/metrics"

	"github.com/latchcsi/latch/internal/attachdetach/decide"
	"github.com/latchcsi/latch/internal/attachdetach/state"
)

// AttachTimeoutsMetric counts the attach attempts that timed out waiting
// for the attacher (decide.AttachTimeouts), each reported on the Pods as
// kube-controller-manager's FailedAttachVolume "timed out waiting for
// external-attacher".
const AttachTimeoutsMetric = "latch_attachdetach_attach_timeouts_total"

func newAttachTimeoutsCounter() *metrics.CounterVec {
	return metrics.NewCounterVec(&metrics.CounterOpts{
		Name:           AttachTimeoutsMetric,
		Help:           "Attach attempts that timed out waiting for the attacher to attach the VolumeAttachment (2 minutes each, retried with kube-controller-manager's backoff), by driver. Each is a FailedAttachVolume event on the Pods.",
		StabilityLevel: metrics.ALPHA,
	}, []string{"driver"})
}

// attachWaits remembers, per key, when the wait for the attacher to attach
// its VolumeAttachment started (decide.Input.AttachWaitSince) and how many
// of its timeouts were counted. A key leaves on its next pass that decides
// anything but that wait (attached, an attach error, no longer wanted,
// VolumeAttachment deleted: each of these runs a pass); after an attach
// error the next wait starts anew, as kube-controller-manager's next
// attempt does. A controller that starts (or becomes leader) starts every
// wait from its first pass, as kube-controller-manager does.
type attachWaits struct {
	mu      sync.Mutex
	waits   map[state.Key]attachWait
	counter *metrics.CounterVec // by driver
}

type attachWait struct {
	since   time.Time
	counted int
}

func newAttachWaits(counter *metrics.CounterVec) *attachWaits {
	return &attachWaits{waits: map[state.Key]attachWait{}, counter: counter}
}

// since returns when key's wait started; zero when it is not waiting.
func (a *attachWaits) since(key state.Key) time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.waits[key].since
}

// record notes the plan of a pass of key decided at now and returns how
// many timeouts it counted that no earlier pass had.
func (a *attachWaits) record(plan decide.Plan, now time.Time) int {
	key := plan.Key
	a.mu.Lock()
	defer a.mu.Unlock()
	if !plan.AttachWaiting {
		delete(a.waits, key)
		return 0
	}
	w, ok := a.waits[key]
	if !ok {
		w = attachWait{since: now}
	}
	n := plan.AttachTimeouts - w.counted
	if n > 0 {
		a.counter.WithLabelValues(driverOf(key.Volume)).Add(float64(n))
		w.counted = plan.AttachTimeouts
	}
	a.waits[key] = w
	return max(n, 0)
}
