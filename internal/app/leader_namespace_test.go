package app

import (
	"os"
	"path/filepath"
	"testing"
)

// external-attacher (csi-lib-utils' leader election) puts its Lease in
// POD_NAMESPACE when --leader-election-namespace is not set; after an image
// swap the Lease must stay where it was.
func TestLeaseNamespace_podNamespaceEnvFirstThenServiceAccountThenDefault(t *testing.T) {
	sa := filepath.Join(t.TempDir(), "namespace")
	if err := os.WriteFile(sa, []byte("from-sa\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "none")
	for _, tc := range []struct{ env, file, want string }{
		{"from-env", sa, "from-env"},
		{"", sa, "from-sa"},
		{"", missing, "default"},
	} {
		if got := namespaceFrom(tc.env, tc.file); got != tc.want {
			t.Errorf("POD_NAMESPACE=%q, file %s: namespace %q, want %q", tc.env, tc.file, got, tc.want)
		}
	}
}
