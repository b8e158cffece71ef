package kube

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

const (
	// finalizerPrefix is the prefix of the finalizer external-attacher puts
	// on VolumeAttachments and PersistentVolumes. It is kept verbatim
	// (not "latch") so that latch and upstream recognise each other's
	// finalizers during a migration in either direction.
	finalizerPrefix = "external-attacher/"

	// leasePrefix is the prefix of the leader election Lease name upstream
	// external-attacher uses; same reason as finalizerPrefix.
	leasePrefix = "external-attacher-leader-"

	// vaNamePrefix is the prefix kube-controller-manager's CSI attacher puts
	// in front of the hash in VolumeAttachment names.
	vaNamePrefix = "csi-"
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

// LeaseName returns the name of the leader election Lease of the
// csi-attacher instances of one driver. Upstream builds
// "external-attacher-leader-" + driver and csi-lib-utils sanitizes the whole
// string; the prefix only has valid characters, so sanitizing the driver
// alone gives the same result.
//
// latch then lower-cases it, which upstream does not: a driver name may
// carry upper case (Kubernetes validates driver names ignoring case, the
// CSI spec allows [A-Z]) but an object name may not, so upstream's Lease
// for "Example.CSI.Driver" ("external-attacher-leader-Example-CSI-Driver")
// is rejected by the API server and its leader election never acquires.
// For every driver upstream can elect with (no upper case), both names are
// equal, so swapping latch and upstream stays safe; for the others upstream
// never holds a Lease that latch could miss. See docs/migration.md.
func LeaseName(driver string) string {
	return leasePrefix + strings.ToLower(SanitizeDriverName(driver))
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
