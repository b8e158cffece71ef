package kube

import "github.com/latchcsi/latch/internal/kube/kubenames"

const (
	// VANodeIDAnnotation is the VolumeAttachment annotation in which
	// csi-attacher records the CSI node ID it published the volume to, so
	// that it can still unpublish after the node's CSINode object is gone.
	// Same key as upstream external-attacher.
	VANodeIDAnnotation = kubenames.VANodeIDAnnotation

	// ControllerManagedAttachAnnotation marks a Node whose volumes are
	// attached and detached by the attach/detach controller (set by the
	// kubelet when --enable-controller-attach-detach is on, the default).
	ControllerManagedAttachAnnotation = kubenames.ControllerManagedAttachAnnotation

	// OutOfServiceTaintKey is the taint an administrator puts on a node that
	// is known to be down; volumes on it are detached at once instead of
	// waiting for the maximum unmount time.
	OutOfServiceTaintKey = kubenames.OutOfServiceTaintKey

	// UniqueVolumeNamePrefix is the plugin part of the unique volume names
	// that Node.status.volumesAttached and volumesInUse use for CSI volumes.
	UniqueVolumeNamePrefix = kubenames.UniqueVolumeNamePrefix

	// UniqueVolumeNameSeparator separates driver and volume handle in a CSI
	// unique volume name.
	UniqueVolumeNameSeparator = kubenames.UniqueVolumeNameSeparator

	// AttacherFieldManager is the field manager of every write csi-attacher
	// makes, so that managedFields show which component owns what.
	AttacherFieldManager = "latch-csi-attacher"

	// AttachDetachFieldManager is the field manager of every write the
	// attach/detach controller makes.
	AttachDetachFieldManager = "latch-attachdetach-controller"
)
