package volume

import (
	"context"
	"errors"
	"fmt"

	storagev1 "k8s.io/api/storage/v1"
)

// ErrSourcePVNotFound is wrapped when a VolumeAttachment's PV is gone, so
// the caller can tell "cannot know the volume handle" from a broken spec.
var ErrSourcePVNotFound = errors.New("source PersistentVolume not found")

// FromVolumeAttachment recovers the volume a VolumeAttachment attaches,
// to rebuild the actual state at start. The PV is translated when it is
// an in-tree PV of a migrated plugin, so the unique name matches what the
// desired state computes for pods. CSIDriver.attachRequired is not
// consulted: an existing VolumeAttachment is an attachment either way.
func (r *Resolver) FromVolumeAttachment(ctx context.Context, va *storagev1.VolumeAttachment, objs Objects) (Attachable, error) {
	src := va.Spec.Source
	switch {
	case src.PersistentVolumeName != nil:
		pv, ok := objs.PersistentVolume(*src.PersistentVolumeName)
		if !ok {
			return Attachable{}, fmt.Errorf("VolumeAttachment %s: PV %s: %w", va.Name, *src.PersistentVolumeName, ErrSourcePVNotFound)
		}
		a, res := r.pvAttachable(ctx, pv, false)
		if res.Status != StatusAttach {
			return Attachable{}, fmt.Errorf("VolumeAttachment %s: %s", va.Name, res.Message)
		}
		return a, nil
	case src.InlineVolumeSpec != nil:
		// Inline specs on VolumeAttachments are already translated.
		csi := src.InlineVolumeSpec.CSI
		if res, ok := checkCSI(csi, "inline spec of VolumeAttachment "+va.Name); !ok {
			return Attachable{}, errors.New(res.Message)
		}
		a := NewAttachable(csi.Driver, csi.VolumeHandle)
		a.InlineSpec = src.InlineVolumeSpec.DeepCopy()
		a.AccessModes = src.InlineVolumeSpec.AccessModes
		a.ReadOnly = csi.ReadOnly
		return a, nil
	}
	return Attachable{}, fmt.Errorf("VolumeAttachment %s has neither a PV name nor an inline volume spec", va.Name)
}
