package kube

import (
	v1 "k8s.io/api/core/v1"

	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// ErrInvalidUniqueVolumeName is wrapped by every ParseUniqueVolumeName
// error; see kubenames.
var ErrInvalidUniqueVolumeName = kubenames.ErrInvalidUniqueVolumeName

// UniqueVolumeName returns the name under which a CSI volume appears in
// Node.status.volumesAttached and volumesInUse; see kubenames.
func UniqueVolumeName(driver, handle string) v1.UniqueVolumeName {
	return kubenames.UniqueVolumeName(driver, handle)
}

// ParseUniqueVolumeName splits a name built by UniqueVolumeName; see
// kubenames.
func ParseUniqueVolumeName(name string) (driver, handle string, err error) {
	return kubenames.ParseUniqueVolumeName(name)
}
