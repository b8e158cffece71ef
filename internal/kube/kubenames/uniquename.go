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
	sum, _ := VolumeAttachmentDigest(nil, volumeHandle, driver, node)
	return vaNamePrefix + hex.EncodeToString(sum[:])
}

// VolumeAttachmentDigest is the SHA-256 that VolumeAttachmentName spells
// in hex. buf is scratch space (nil will do); the grown buffer is
// returned for the next call, so that a loop over many volumes (the
// controller's verify pass) allocates nothing per volume.
func VolumeAttachmentDigest(buf []byte, volumeHandle, driver, node string) (sum [sha256.Size]byte, scratch []byte) {
	buf = append(append(append(buf[:0], volumeHandle...), driver...), node...)
	return sha256.Sum256(buf), buf
}

// VolumeAttachmentNameDigest returns the digest a name of
// VolumeAttachmentName's form spells: the "csi-" prefix, then exactly 64
// lowercase hex digits (hex.EncodeToString's form; a name in capitals is
// another name). ok is false for any other name.
func VolumeAttachmentNameDigest(name string) (sum [sha256.Size]byte, ok bool) {
	digits, ok := strings.CutPrefix(name, vaNamePrefix)
	if !ok || len(digits) != 2*len(sum) {
		return sum, false
	}
	for i := range sum {
		hi, ok1 := lowerHexDigit(digits[2*i])
		lo, ok2 := lowerHexDigit(digits[2*i+1])
		if !ok1 || !ok2 {
			return sum, false
		}
		sum[i] = hi<<4 | lo
	}
	return sum, true
}

func lowerHexDigit(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}
