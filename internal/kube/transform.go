package kube

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/tools/cache"
)

// Informer cache transforms. Since client-go v1.27 a TransformFunc sees an
// object before anyone else, so mutating it in place is safe; transforms
// must be idempotent, as client-go requires for objects that may be passed
// through Replace again. The attacher's own, narrower transform lives in
// internal/attacher.

// StripManagedFields drops metadata.managedFields from every object before
// it enters an informer cache. Neither controller reads them and they are
// often the largest part of an object. Non-object values (for example
// cache.DeletedFinalStateUnknown tombstones) are passed through unchanged.
func StripManagedFields(obj any) (any, error) {
	if _, isTombstone := obj.(cache.DeletedFinalStateUnknown); isTombstone {
		return obj, nil
	}
	if accessor, err := meta.Accessor(obj); err == nil && accessor.GetManagedFields() != nil {
		accessor.SetManagedFields(nil)
	}
	return obj, nil
}

var _ cache.TransformFunc = StripManagedFields

// PVDriverFunc returns the CSI driver that handles a PersistentVolume, or ""
// when none does. The default, CSIDriverOfPV, only looks at spec.csi; a
// caller that supports CSI migration passes a function that also
// translates in-tree sources.
type PVDriverFunc func(pv *v1.PersistentVolume) string

// CSIDriverOfPV returns spec.csi.driver, or "" for a non-CSI PV.
func CSIDriverOfPV(pv *v1.PersistentVolume) string {
	if pv.Spec.CSI == nil {
		return ""
	}
	return pv.Spec.CSI.Driver
}
