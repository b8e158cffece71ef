package controller

import (
	storagev1 "k8s.io/api/storage/v1"

	"github.com/latchcsi/latch/internal/attachdetach/decide"
)

// CSINodes are read for one thing only: the migrated-plugins annotation
// (Config.MigrationByNode); their transform, trimCSINode, is in
// transforms.go with the other informers'.

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
