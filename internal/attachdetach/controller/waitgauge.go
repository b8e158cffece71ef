package controller

import (
	"sync"

	"k8s.io/component-base/metrics"

	"github.com/latchcsi/latch/internal/attachdetach/state"
)

// waitGauge tracks the keys whose last pass waited for one reason, for a
// gauge with one label: the gauge of a label value is the number of its
// keys here. Two instances exist: the keys waiting for their node to
// migrate the volume's in-tree plugin (Config.MigrationByNode; label: the
// plugin) and the keys waiting for another node to let an exclusive volume
// go (Multi-Attach; label: the driver). A key leaves on its next pass that
// decides anything else (attached, no longer wanted, node deleted: each of
// these runs a pass). One lock guards the set and its gauge updates, so
// the two never disagree.
type waitGauge struct {
	mu    sync.Mutex
	keys  map[state.Key]string // → label value
	gauge *metrics.GaugeVec
}

func newWaitGauge(gauge *metrics.GaugeVec) *waitGauge {
	return &waitGauge{keys: map[state.Key]string{}, gauge: gauge}
}

// record notes the outcome of a pass of key: whether it waited, and the
// label value it counts under while it does.
func (m *waitGauge) record(key state.Key, label string, waiting bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	prev, was := m.keys[key]
	switch {
	case waiting && !was:
		m.keys[key] = label
		m.gauge.WithLabelValues(label).Inc()
	case !waiting && was:
		delete(m.keys, key)
		m.gauge.WithLabelValues(prev).Dec()
	}
}
