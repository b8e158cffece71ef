package controller

import (
	"sync"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/component-base/metrics"

	"github.com/latchcsi/latch/internal/attachdetach/decide"
	"github.com/latchcsi/latch/internal/attachdetach/state"
)

// CSINodes are read for one thing only: the migrated-plugins annotation
// that says whether the kubelet of a node handles an in-tree plugin
// through CSI (Config.MigrationByNode).

// trimCSINode is the CSINode informer's transform: it keeps the name (the
// cache key), the resourceVersion and the migrated-plugins annotation, and
// drops the rest (the per-driver entries, which grow with the drivers
// installed on the node and which the controller never reads). The result
// is a new object, so running it twice gives the same result.
func trimCSINode(obj any) (any, error) {
	cn, ok := obj.(*storagev1.CSINode)
	if !ok {
		// Tombstones hold an object that was trimmed when it was cached.
		return obj, nil
	}
	out := &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: cn.Name, ResourceVersion: cn.ResourceVersion}}
	if v, ok := cn.Annotations[v1.MigratedPluginsAnnotationKey]; ok {
		out.Annotations = map[string]string{v1.MigratedPluginsAnnotationKey: v}
	}
	return out, nil
}

var _ cache.TransformFunc = trimCSINode

func (c *Controller) csiNodeChanged(oldObj, obj any) {
	cn, ok := obj.(*storagev1.CSINode)
	if !ok {
		return
	}
	old, _ := oldObj.(*storagev1.CSINode)
	if old != nil && decide.CSINodeFactsOf(old) == decide.CSINodeFactsOf(cn) {
		// The kubelet rewrites its CSINode for driver registrations; only
		// the annotation matters here.
		return
	}
	c.wake.MigrationKeys(cn.Name)
}

func (c *Controller) csiNodeDeleted(obj any) {
	cn, ok := tombstone(obj).(*storagev1.CSINode)
	if !ok {
		return
	}
	c.wake.MigrationKeys(cn.Name)
}

// migrationWaits tracks the keys whose last pass waited for their node to
// migrate the volume's in-tree plugin, for the waiting gauge. A key leaves
// it on its next pass that decides anything else (attached, no longer
// wanted, node deleted: each of these runs a pass).
type migrationWaits struct {
	mu    sync.Mutex
	keys  map[state.Key]string // → in-tree plugin
	gauge *metrics.GaugeVec
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
