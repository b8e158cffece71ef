package controller

import (
	"sync"

	"k8s.io/component-base/metrics"

	"github.com/latchcsi/latch/internal/attachdetach/state"
)

// migrationWaits tracks the keys whose last pass waited for their node to
// migrate the volume's in-tree plugin (Config.MigrationByNode), for the
// waiting gauge: the gauge of a plugin is the number of its keys here. A
// key leaves on its next pass that decides anything else (attached, no
// longer wanted, node deleted: each of these runs a pass). One lock
// guards the set and its gauge updates, so the two never disagree.
type migrationWaits struct {
	mu    sync.Mutex
	keys  map[state.Key]string // → in-tree plugin
	gauge *metrics.GaugeVec    // by plugin
}

func newMigrationWaits(gauge *metrics.GaugeVec) *migrationWaits {
	return &migrationWaits{keys: map[state.Key]string{}, gauge: gauge}
}

// record notes the outcome of a pass of key; plugin is the in-tree plugin
// of the key's volume ("" for native CSI volumes or unknown).
func (m *migrationWaits) record(key state.Key, plugin string, waiting bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	prev, was := m.keys[key]
	switch {
	case waiting && !was:
		m.keys[key] = plugin
		m.gauge.WithLabelValues(plugin).Inc()
	case !waiting && was:
		delete(m.keys, key)
		m.gauge.WithLabelValues(prev).Dec()
	}
}
