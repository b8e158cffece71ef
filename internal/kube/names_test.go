package kube

import "testing"

func TestLeaseName(t *testing.T) {
	tests := []struct {
		driver, lease string
	}{
		{"csi/test", "external-attacher-leader-csi-test"},
		// upstream's Lease would be "...-foo-X", not a valid object name.
		{"foo.", "external-attacher-leader-foo-x"},
		{"pd.csi.storage.gke.io", "external-attacher-leader-pd-csi-storage-gke-io"},
		// Upper case is valid in a driver name, not in an object name: the
		// Lease name is lower-cased (upstream's
		// "external-attacher-leader-Example-CSI-Driver" is rejected by the
		// API server, so its leader election never acquires the Lease).
		{"Example.CSI.Driver", "external-attacher-leader-example-csi-driver"},
	}
	for _, tt := range tests {
		t.Run(tt.driver, func(t *testing.T) {
			if got := LeaseName(tt.driver); got != tt.lease {
				t.Errorf("LeaseName(%q) = %q, want %q", tt.driver, got, tt.lease)
			}
		})
	}
}
