package decide

import (
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
)

// Annotations latch adds to a VolumeAttachment, next to upstream's node-id
// annotation, so that detach never depends on objects that may be gone by
// then (a deleted PV used to leave upstream's attacher stuck forever).
const (
	// AnnVolumeHandle is the CSI volume handle the volume was published with.
	AnnVolumeHandle = "attacher.latch.dev/volume-handle"
	// AnnSecretRef is "namespace/name" of the controller-publish secret, if any.
	AnnSecretRef = "attacher.latch.dev/controller-publish-secret"
)

// DriverInfo is what the decision needs to know about the driver.
type DriverInfo struct {
	Name string
	// SupportsReadOnly is PUBLISH_READONLY.
	SupportsReadOnly bool
	// SupportsSingleNodeMultiWriter is SINGLE_NODE_MULTI_WRITER.
	SupportsSingleNodeMultiWriter bool
	// DefaultFSType is --default-fstype, used when the PV names none.
	DefaultFSType string
}

// Observed is the state one decision is made from. Nil pointers mean "not
// found"; the caller never passes objects it failed to read for another
// reason (it retries instead).
type Observed struct {
	VA      *storagev1.VolumeAttachment
	PV      *v1.PersistentVolume // for spec.source.persistentVolumeName
	CSINode *storagev1.CSINode   // for spec.nodeName
	// Trivial: the driver has no PUBLISH_UNPUBLISH_VOLUME (Config.Trivial).
	// An attach only marks the VA attached; a detach has nothing to do.
	Trivial bool
	// StillPublished (detach only): the ListVolumes reconcile found the
	// volume of this deleting VA published on its node although our
	// finalizer is gone, so no detach of ours is coming: unpublish it
	// anyway (RepairFor).
	StillPublished bool
	// Pending (attach only): every publication the attacher still has to
	// undo, or whose VolumeAttachment's fate it does not know yet
	// (orphans and suspects), in a stable order. A publish of a
	// single-node volume waits while one of its handle is on another node
	// ID (PublishBlockedByOrphan). Only those of the volume's handle
	// (PublishHandle) matter; the others may be left out.
	Pending []Orphan
}

// Volume is what ControllerPublish/Unpublish need, resolved from the PV, the
// inline spec, or (detach only) the annotations latch left on the VA.
type Volume struct {
	Handle        string
	ReadOnly      bool
	VolumeContext map[string]string
	// Secret is the controller-publish secret reference, nil when none.
	Secret *v1.SecretReference
	// Access modes, volume mode, fsType and mount options of the PV: the
	// executor turns them into a CSI VolumeCapability.
	AccessModes  []v1.PersistentVolumeAccessMode
	Block        bool
	FSType       string
	MountOptions []string
	// Migrated is true when the volume was translated from an in-tree spec.
	Migrated bool
}

// Translator turns in-tree volume specs into CSI ones (CSI migration).
// It takes no logger: the caller binds one (package attacher adapts
// csi-translation-lib's translator), so that this package never reaches
// for a global one.
type Translator interface {
	// IsPVMigratable reports whether pv is an in-tree PV with a CSI driver
	// to migrate to.
	IsPVMigratable(pv *v1.PersistentVolume) bool
	// TranslateInTreePVToCSI returns a copy of pv with spec.csi set.
	TranslateInTreePVToCSI(pv *v1.PersistentVolume) (*v1.PersistentVolume, error)
}
