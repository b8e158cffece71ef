package controller

import (
	"strconv"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/latchcsi/latch/internal/attachdetach/state"
	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// opTimes remembers when attaches and detaches started, for the operation
// duration histogram. Entries of operations that never finish (the key
// was forgotten) are dropped when the same key starts another one.
type opTimes struct {
	mu      sync.Mutex
	attach  map[state.Key]attachStart
	detach  map[string]detachStart
	maxSize int
	// migratedOf says whether the volume attached (or attaching) at key
	// is an in-tree volume migrated to CSI (the migrated label of
	// storage_operation_duration_seconds); nil: never. Set by setSource.
	migratedOf func(state.Key) bool
}

// attachStart is an attach in progress: created is when the
// VolumeAttachment was created (latch_attachdetach_operation_duration_seconds),
// attempt when the current attempt started (storage_operation_duration_seconds,
// which, as kube-controller-manager's, ends an attempt at an attach error
// and times the next one from there); failed says the current attempt's
// failure is recorded.
type attachStart struct {
	created, attempt time.Time
	failed           bool
}

type detachStart struct {
	key      state.Key
	start    time.Time
	migrated bool
}

func (o *opTimes) migrated(key state.Key) bool {
	return o.migratedOf != nil && o.migratedOf(key)
}

func newOpTimes() *opTimes {
	return &opTimes{attach: map[state.Key]attachStart{}, detach: map[string]detachStart{}, maxSize: 100000}
}

func (o *opTimes) attachStarted(key state.Key, now time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.attach) < o.maxSize {
		o.attach[key] = attachStart{created: now, attempt: now}
	}
}

// attachFailed records the attach at key as failed (its VolumeAttachment
// reports an attach error): storage_operation_duration_seconds with
// status fail-unknown, as kube-controller-manager, once per attach — the
// passes that see an error again add nothing until the attach succeeds or
// starts anew — and the next attempt is timed from now.
func (o *opTimes) attachFailed(key state.Key, now time.Time, m *Metrics) {
	o.mu.Lock()
	a, ok := o.attach[key]
	if ok && !a.failed {
		o.attach[key] = attachStart{created: a.created, attempt: now, failed: true}
	}
	o.mu.Unlock()
	if ok && !a.failed {
		m.storageOperation.WithLabelValues(pluginName(key.Volume), "volume_attach", "fail-unknown", strconv.FormatBool(o.migrated(key))).Observe(now.Sub(a.attempt).Seconds())
	}
}

// attachTimedOut records n attempts of the attach at key that timed out
// waiting for the attacher (decide.AttachTimeouts), as kube-controller-
// manager records each: storage_operation_duration_seconds with status
// fail-unknown, each attempt timed from the end of the one before. The
// next attempt is timed from now.
func (o *opTimes) attachTimedOut(key state.Key, n int, now time.Time, m *Metrics) {
	o.mu.Lock()
	a, ok := o.attach[key]
	if ok {
		o.attach[key] = attachStart{created: a.created, attempt: now, failed: a.failed}
	}
	o.mu.Unlock()
	if !ok || n <= 0 {
		return
	}
	h := m.storageOperation.WithLabelValues(pluginName(key.Volume), "volume_attach", "fail-unknown", strconv.FormatBool(o.migrated(key)))
	each := now.Sub(a.attempt).Seconds() / float64(n)
	for range n {
		h.Observe(each)
	}
}

func (o *opTimes) attachDone(key state.Key, now time.Time, m *Metrics) {
	o.mu.Lock()
	a, ok := o.attach[key]
	delete(o.attach, key)
	o.mu.Unlock()
	if ok {
		m.operationDuration.WithLabelValues("attach", driverOf(key.Volume)).Observe(now.Sub(a.created).Seconds())
		m.storageOperation.WithLabelValues(pluginName(key.Volume), "volume_attach", "success", strconv.FormatBool(o.migrated(key))).Observe(now.Sub(a.attempt).Seconds())
	}
}

func (o *opTimes) detachStarted(name string, key state.Key, now time.Time) {
	migrated := o.migrated(key) // before o.mu: it reads the actual state
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.attach, key)
	if len(o.detach) < o.maxSize {
		o.detach[name] = detachStart{key: key, start: now, migrated: migrated}
	}
}

func (o *opTimes) detachCancelled(name string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.detach, name)
}

func (o *opTimes) detached(name string, now time.Time, m *Metrics) {
	o.mu.Lock()
	d, ok := o.detach[name]
	delete(o.detach, name)
	o.mu.Unlock()
	if ok {
		m.operationDuration.WithLabelValues("detach", driverOf(d.key.Volume)).Observe(now.Sub(d.start).Seconds())
		m.storageOperation.WithLabelValues(pluginName(d.key.Volume), "volume_detach", "success", strconv.FormatBool(d.migrated)).Observe(now.Sub(d.start).Seconds())
	}
}

func driverOf(vol v1.UniqueVolumeName) string {
	driver, _, _ := kubenames.ParseUniqueVolumeName(string(vol))
	return driver
}
