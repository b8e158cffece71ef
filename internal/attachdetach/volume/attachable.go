// Package volume turns the volumes of a Pod into the CSI volumes the
// attach/detach controller must attach, the way kube-controller-manager's
// desired-state populator does: PVC → bound PV, generic ephemeral volumes,
// in-tree PVs and inline volumes translated by k8s.io/csi-translation-lib,
// and CSIDriver.spec.attachRequired.
//
// Everything here is pure: objects are looked up through the Objects
// interface (backed by listers in production, by maps in tests).
package volume

import (
	"slices"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// Attachable is a CSI volume that needs a VolumeAttachment before a pod on
// a controller-managed node can use it.
//
// Exactly one of PVName and InlineSpec is set: PVName for PVC-backed
// volumes, InlineSpec for in-tree inline volumes translated to CSI (the
// VolumeAttachment carries the translated spec because there is no PV).
type Attachable struct {
	// UniqueName is "kubernetes.io/csi/<driver>^<handle>", the key of the
	// desired and actual state and the name in Node.status.
	UniqueName v1.UniqueVolumeName
	// Driver is the CSI driver name (VolumeAttachment.spec.attacher).
	Driver string
	// VolumeHandle is the CSI volume ID.
	VolumeHandle string
	// PVName is the PersistentVolume the VolumeAttachment points to.
	PVName string
	// InlineSpec is the translated spec of a migrated inline volume.
	InlineSpec *v1.PersistentVolumeSpec
	// SpecName is the name upstream shows in events ("for volume %q"): the
	// PV name, or the name of the translated PV for inline volumes.
	SpecName string
	// AccessModes decide whether the volume may be attached to several
	// nodes at once; empty means "unknown", which upstream allows.
	AccessModes []v1.PersistentVolumeAccessMode
	// ReadOnly is the pod's readOnly flag for the claim (or the inline
	// source's); informational, the VolumeAttachment does not carry it.
	ReadOnly bool
	// MigratedFrom is the in-tree plugin name when the volume was
	// translated from an in-tree spec, "" for native CSI volumes.
	MigratedFrom string
}

// NewAttachable fills the derived fields of an Attachable for a CSI
// driver and volume handle.
func NewAttachable(driver, handle string) Attachable {
	return Attachable{
		UniqueName:   kubenames.UniqueVolumeName(driver, handle),
		Driver:       driver,
		VolumeHandle: handle,
	}
}

// MultiAttachAllowed reports whether the volume may be attached to more
// than one node at a time. Like upstream (pkg/volume/util
// IsMultiAttachAllowed), only a volume whose access modes are known and
// include neither ReadWriteMany nor ReadOnlyMany is exclusive: without
// access modes the controller cannot know and lets the driver refuse.
func MultiAttachAllowed(modes []v1.PersistentVolumeAccessMode) bool {
	if len(modes) == 0 {
		return true
	}
	return slices.Contains(modes, v1.ReadWriteMany) || slices.Contains(modes, v1.ReadOnlyMany)
}

// MultiAttachAllowed is MultiAttachAllowed(a.AccessModes).
func (a *Attachable) MultiAttachAllowed() bool {
	return MultiAttachAllowed(a.AccessModes)
}

// AttachmentName is the name of the VolumeAttachment of this volume on
// node, the same name kube-controller-manager uses so that latch adopts
// existing attachments.
func (a *Attachable) AttachmentName(node string) string {
	return kubenames.VolumeAttachmentName(a.VolumeHandle, a.Driver, node)
}

// Source is the VolumeAttachment source for this volume.
func (a *Attachable) Source() storagev1.VolumeAttachmentSource {
	if a.InlineSpec != nil {
		return storagev1.VolumeAttachmentSource{InlineVolumeSpec: a.InlineSpec.DeepCopy()}
	}
	pv := a.PVName
	return storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv}
}

// VolumeAttachment is the object to create to attach the volume to node,
// field for field what kube-controller-manager's CSI attacher creates.
func (a *Attachable) VolumeAttachment(node string) *storagev1.VolumeAttachment {
	va := &storagev1.VolumeAttachment{
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: a.Driver,
			NodeName: node,
			Source:   a.Source(),
		},
	}
	va.Name = a.AttachmentName(node)
	return va
}

// AttachmentNameFor is the VolumeAttachment name for a unique volume name
// on node, for entries whose spec is unknown (rebuilt from Node.status).
func AttachmentNameFor(unique v1.UniqueVolumeName, node string) (string, error) {
	driver, handle, err := kubenames.ParseUniqueVolumeName(string(unique))
	if err != nil {
		return "", err
	}
	return kubenames.VolumeAttachmentName(handle, driver, node), nil
}
