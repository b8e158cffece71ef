// Package kubenames holds the object names and keys latch shares with
// upstream (finalizers, the node-id annotation, unique volume names,
// VolumeAttachment names) as a leaf: it imports nothing but the standard
// library and the core API types, so the pure decide packages (and the
// state they read) can use them without linking package kube's clients.
// Every package takes them from here (package kube no longer re-exports
// them, so that each has one name).
package kubenames

import "strings"

const (
	// finalizerPrefix is the prefix of the finalizer external-attacher puts
	// on VolumeAttachments and PersistentVolumes. It is kept verbatim
	// (not "latch") so that latch and upstream recognise each other's
	// finalizers during a migration in either direction.
	finalizerPrefix = "external-attacher/"

	// VANodeIDAnnotation is the VolumeAttachment annotation in which
	// csi-attacher records the CSI node ID it published the volume to, so
	// that it can still unpublish after the node's CSINode object is gone.
	// Same key as upstream external-attacher.
	VANodeIDAnnotation = "csi.alpha.kubernetes.io/node-id"

	// ControllerManagedAttachAnnotation marks a Node whose volumes are
	// attached and detached by the attach/detach controller (set by the
	// kubelet when --enable-controller-attach-detach is on, the default).
	ControllerManagedAttachAnnotation = "volumes.kubernetes.io/controller-managed-attach-detach"

	// OutOfServiceTaintKey is the taint an administrator puts on a node that
	// is known to be down; volumes on it are detached at once instead of
	// waiting for the maximum unmount time.
	OutOfServiceTaintKey = "node.kubernetes.io/out-of-service"
)

// SanitizeDriverName turns a CSI driver name into something usable as a
// finalizer suffix or a Lease name, exactly like upstream external-attacher
// (and csi-lib-utils' leader election) do: every character outside
// [a-zA-Z0-9-] becomes a single '-' (a multi-byte UTF-8 character or an
// invalid byte also counts as one character), and when the result ends with
// '-' an 'X' is appended because object names must not end with '-'.
//
// Upstream panics on an empty name; latch returns "X" instead (consistent
// with the rule applied to an empty result). Drivers cannot report an empty
// name anyway: GetPluginInfo with an empty name is rejected at startup.
func SanitizeDriverName(driver string) string {
	var b strings.Builder
	b.Grow(len(driver) + 1)
	for _, r := range driver {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-':
			b.WriteRune(r)
		default:
			// Covers utf8.RuneError for invalid bytes too: range yields it
			// once per invalid byte, as the upstream regexp does.
			b.WriteByte('-')
		}
	}
	if s := b.String(); s != "" && s[len(s)-1] != '-' {
		return s
	}
	b.WriteByte('X')
	return b.String()
}

// AttacherFinalizer returns the finalizer csi-attacher puts on the
// VolumeAttachments and PersistentVolumes of the given driver:
// "external-attacher/<sanitized driver>".
func AttacherFinalizer(driver string) string {
	return finalizerPrefix + SanitizeDriverName(driver)
}

// PVFinalizer returns the finalizer csi-attacher puts on PersistentVolumes
// that have VolumeAttachments. Upstream external-attacher uses the very same
// string as on VolumeAttachments (GetFinalizerName for both), so this is an
// alias kept for readability at call sites.
func PVFinalizer(driver string) string {
	return AttacherFinalizer(driver)
}
