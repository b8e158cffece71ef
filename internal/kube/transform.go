package kube

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// Informer cache transforms. Since client-go v1.27 a TransformFunc sees an
// object before anyone else, so mutating it in place is safe; both
// transforms are idempotent, as client-go requires for objects that may be
// passed through Replace again.

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

// TrimForeignPVs returns an informer transform that shrinks every
// PersistentVolume whose driver (per driverOf, CSIDriverOfPV when nil) is
// not accepted by ours. A csi-attacher sidecar watches all PVs of a
// cluster but only acts on its own driver's; in clusters with many drivers
// or many in-tree PVs, the other PVs would dominate its memory.
//
// What a trimmed PV keeps, and why:
//   - metadata name, uid, resourceVersion: identity, and so that a later
//     event for it is not mistaken for a new object;
//   - metadata deletionTimestamp and finalizers: lets the PV finalizer logic
//     and diagnosis (latchctl) see a foreign PV that still carries a
//     finalizer of ours, e.g. after a driver rename;
//   - spec.csi.driver and spec.csi.volumeHandle (CSI PVs only): the driver
//     keeps the transform idempotent (a trimmed PV is still recognised as
//     foreign) and the handle keeps volume-handle indexes meaningful;
//   - spec.claimRef namespace, name and uid: PVC→PV lookups still resolve
//     and do not report a bound claim as unbound;
//   - status.phase: cheap and useful in diagnosis.
//
// Everything else (labels, annotations, capacity, access modes, node
// affinity, in-tree sources, mount options, secrets references) is dropped.
// Tombstones and non-PV objects pass through unchanged. PVs of our driver
// are returned untouched (chain StripManagedFields separately).
func TrimForeignPVs(driverOf PVDriverFunc, ours func(driver string) bool) cache.TransformFunc {
	if driverOf == nil {
		driverOf = CSIDriverOfPV
	}
	return func(obj any) (any, error) {
		pv, ok := obj.(*v1.PersistentVolume)
		if !ok || ours(driverOf(pv)) {
			return obj, nil
		}
		return trimPV(pv), nil
	}
}

func trimPV(pv *v1.PersistentVolume) *v1.PersistentVolume {
	out := &v1.PersistentVolume{
		TypeMeta: pv.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name:              pv.Name,
			UID:               pv.UID,
			ResourceVersion:   pv.ResourceVersion,
			DeletionTimestamp: pv.DeletionTimestamp,
			Finalizers:        pv.Finalizers,
		},
		Status: v1.PersistentVolumeStatus{Phase: pv.Status.Phase},
	}
	if pv.Spec.CSI != nil {
		out.Spec.CSI = &v1.CSIPersistentVolumeSource{
			Driver:       pv.Spec.CSI.Driver,
			VolumeHandle: pv.Spec.CSI.VolumeHandle,
		}
	}
	if ref := pv.Spec.ClaimRef; ref != nil {
		out.Spec.ClaimRef = &v1.ObjectReference{
			Namespace: ref.Namespace,
			Name:      ref.Name,
			UID:       ref.UID,
		}
	}
	return out
}

// ChainTransforms runs transforms in order; the result of one is the input
// of the next. Informers accept a single TransformFunc.
func ChainTransforms(transforms ...cache.TransformFunc) cache.TransformFunc {
	return func(obj any) (any, error) {
		var err error
		for _, t := range transforms {
			if obj, err = t(obj); err != nil {
				return nil, err
			}
		}
		return obj, nil
	}
}
