package kubetest

import "testing"

func TestResourceOfPath(t *testing.T) {
	for path, want := range map[string][2]string{
		"/apis/storage.k8s.io/v1/volumeattachments/va-1/status": {"volumeattachments", "status"},
		"/apis/storage.k8s.io/v1/volumeattachments":             {"volumeattachments", ""},
		"/api/v1/persistentvolumes/pv-1":                        {"persistentvolumes", ""},
		"/api/v1/namespaces/ns/pods":                            {"pods", ""},
		"/api/v1/namespaces/ns/pods/p/status":                   {"pods", "status"},
		"/api/v1/namespaces/ns":                                 {"namespaces", ""},
		"/apis/coordination.k8s.io/v1/namespaces/ns/leases/l":   {"leases", ""},
		"/healthz": {"/healthz", ""},
	} {
		if res, sub := ResourceOfPath(path); res != want[0] || sub != want[1] {
			t.Errorf("ResourceOfPath(%q) = %q, %q, want %q, %q", path, res, sub, want[0], want[1])
		}
	}
}
