package controller

import (
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/latchcsi/latch/internal/attachdetach/decide"
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

func (c *Controller) csiNodeDeleted(cn *storagev1.CSINode) {
	c.wake.MigrationKeys(cn.Name)
}
