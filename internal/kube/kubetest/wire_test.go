package kubetest

import "testing"

func TestResourceOfPath(t *testing.T) {
	for path, want := range map[string]string{
		"/apis/storage.k8s.io/v1/volumeattachments/va-1/status": "volumeattachments",
		"/apis/storage.k8s.io/v1/volumeattachments":             "volumeattachments",
		"/api/v1/persistentvolumes/pv-1":                        "persistentvolumes",
		"/api/v1/namespaces/ns/pods":                            "pods",
		"/api/v1/namespaces/ns":                                 "namespaces",
		"/apis/coordination.k8s.io/v1/namespaces/ns/leases/l":   "leases",
	} {
		if got := resourceOfPath(path); got != want {
			t.Errorf("resourceOfPath(%q) = %q, want %q", path, got, want)
		}
	}
}
