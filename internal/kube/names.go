package kube

import (
	"strings"

	"github.com/latchcsi/latch/internal/kube/kubenames"
)

const (
	// leasePrefix is the prefix of the leader election Lease name upstream
	// external-attacher uses; kept verbatim like the finalizer prefix
	// (kubenames).
	leasePrefix = "external-attacher-leader-"
)

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
	return leasePrefix + strings.ToLower(kubenames.SanitizeDriverName(driver))
}

// OrphanRecordName is the name of the ConfigMap in which csi-attacher of
// driver keeps the publications it still has to undo (orphaned
// publications), in the Lease's namespace; the driver name is sanitized
// and lower-cased as in the Lease name.
func OrphanRecordName(driver string) string {
	return "external-attacher-orphans-" + strings.ToLower(kubenames.SanitizeDriverName(driver))
}
