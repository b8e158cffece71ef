package kube

import (
	"testing"

	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// The finalizer and the Lease name come from the same sanitized driver
// name.
func TestAttacherFinalizerAndLeaseName(t *testing.T) {
	tests := []struct {
		driver, finalizer, lease string
	}{
		{"csi/test", "external-attacher/csi-test", "external-attacher-leader-csi-test"},
		// upstream's Lease would be "...-foo-X", not a valid object name.
		{"foo.", "external-attacher/foo-X", "external-attacher-leader-foo-x"},
		{"pd.csi.storage.gke.io", "external-attacher/pd-csi-storage-gke-io", "external-attacher-leader-pd-csi-storage-gke-io"},
		// Upper case is valid in a driver name and in a finalizer (kept,
		// as upstream keeps it), not in an object name: the Lease name is
		// lower-cased (upstream's "external-attacher-leader-Example-CSI-Driver"
		// is rejected by the API server, so its leader election never
		// acquires the Lease).
		{"Example.CSI.Driver", "external-attacher/Example-CSI-Driver", "external-attacher-leader-example-csi-driver"},
	}
	for _, tt := range tests {
		t.Run(tt.driver, func(t *testing.T) {
			if got := kubenames.AttacherFinalizer(tt.driver); got != tt.finalizer {
				t.Errorf("AttacherFinalizer(%q) = %q, want %q", tt.driver, got, tt.finalizer)
			}
			if got := kubenames.PVFinalizer(tt.driver); got != tt.finalizer {
				t.Errorf("PVFinalizer(%q) = %q, want %q (upstream uses one name for VA and PV)", tt.driver, got, tt.finalizer)
			}
			if got := LeaseName(tt.driver); got != tt.lease {
				t.Errorf("LeaseName(%q) = %q, want %q", tt.driver, got, tt.lease)
			}
		})
	}
}
