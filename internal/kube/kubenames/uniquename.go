package kubenames

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
)

const (
	// UniqueVolumeNamePrefix is the plugin part of the unique volume names
	// that Node.status.volumesAttached and volumesInUse use for CSI volumes.
	UniqueVolumeNamePrefix = "kubernetes.io/csi/"

	// UniqueVolumeNameSeparator separates driver and volume handle in a CSI
	// unique volume name.
	UniqueVolumeNameSeparator = "^"

	vaNamePrefix = "csi-"
)

// ErrInvalidUniqueVolumeName is wrapped by every ParseUniqueVolumeName error
// so callers can tell a malformed name (e.g. an in-tree volume in
// Node.status) from other failures with errors.Is.
var ErrInvalidUniqueVolumeName = errors.New("invalid CSI unique volume name")

// UniqueVolumeName returns the name under which a CSI volume appears in
// Node.status.volumesAttached and volumesInUse:
// "kubernetes.io/csi/<driver>^<volume handle>", as built by the kubelet and
// kube-controller-manager.
func UniqueVolumeName(driver, handle string) v1.UniqueVolumeName {
	return v1.UniqueVolumeName(UniqueVolumeNamePrefix + driver + UniqueVolumeNameSeparator + handle)
}

// ParseUniqueVolumeName splits a name built by UniqueVolumeName. The driver
// ends at the first '^': driver names cannot contain it, volume handles can.
// Names of other volume plugins (e.g. "kubernetes.io/aws-ebs/...") are
// rejected, not ignored, so a caller decides explicitly what to do with them.
func ParseUniqueVolumeName(name string) (driver, handle string, err error) {
	rest, ok := strings.CutPrefix(name, UniqueVolumeNamePrefix)
	if !ok {
		return "", "", fmt.Errorf("parse unique volume name %q: %w: missing prefix %q", name, ErrInvalidUniqueVolumeName, UniqueVolumeNamePrefix)
	}
	driver, handle, ok = strings.Cut(rest, UniqueVolumeNameSeparator)
	if !ok {
		return "", "", fmt.Errorf("parse unique volume name %q: %w: missing separator %q between driver and volume handle", name, ErrInvalidUniqueVolumeName, UniqueVolumeNameSeparator)
	}
	if driver == "" {
		return "", "", fmt.Errorf("parse unique volume name %q: %w: empty driver name", name, ErrInvalidUniqueVolumeName)
	}
	if handle == "" {
		return "", "", fmt.Errorf("parse unique volume name %q: %w: empty volume handle", name, ErrInvalidUniqueVolumeName)
	}
	return driver, handle, nil
}

// VolumeAttachmentName returns the name kube-controller-manager's CSI
// attacher gives the VolumeAttachment of one volume on one node:
// "csi-" + hex(sha256(volumeHandle + driver + node)). The three strings are
// concatenated without a separator, exactly like upstream; this is
// ambiguous in theory ("ab"+"c" vs "a"+"bc") but changing it would break
// adoption of existing VolumeAttachments.
func VolumeAttachmentName(volumeHandle, driver, node string) string {
	h := sha256.New()
	h.Write([]byte(volumeHandle))
	h.Write([]byte(driver))
	h.Write([]byte(node))
	return vaNamePrefix + hex.EncodeToString(h.Sum(nil))
}
