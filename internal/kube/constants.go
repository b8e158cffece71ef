package kube

// The field managers of latch's writes, so that managedFields show which
// component owns what. The names latch shares with upstream (annotations,
// taints, finalizers, unique volume names) are in package kubenames.
const (
	// AttacherFieldManager is the field manager of every write csi-attacher
	// makes.
	AttacherFieldManager = "latch-csi-attacher"

	// AttachDetachFieldManager is the field manager of every write the
	// attach/detach controller makes.
	AttachDetachFieldManager = "latch-attachdetach-controller"
)
