// Package boundaries holds tests that enforce the module's layering rules.
package boundaries

import (
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// productionBinaries ship to clusters and must stay small and free of the
// test control plane: no k8s.io/kubernetes (the in-process API server) and
// no etcd.
var productionBinaries = []string{
	"cmd/csi-attacher",
	"cmd/attachdetach-controller",
	"cmd/latchctl",
	"cmd/csi-mock-driver",
}

// forbiddenPrefixes are import path prefixes production binaries must not
// link.
var forbiddenPrefixes = []string{
	"k8s.io/kubernetes",
	"go.etcd.io/etcd",
}

func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate the test file")
	}
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// forbiddenDeps lists the forbidden packages pkg links, using go list -deps.
func forbiddenDeps(t *testing.T, root, pkg string) []string {
	t.Helper()
	return depsUnder(t, root, pkg, forbiddenPrefixes)
}

func TestProductionBinariesDoNotLinkTheTestControlPlane(t *testing.T) {
	root := repoRoot(t)
	checked := 0
	for _, bin := range productionBinaries {
		if files, _ := filepath.Glob(filepath.Join(root, bin, "*.go")); len(files) == 0 {
			t.Logf("%s does not exist yet", bin)
			continue
		}
		checked++
		if bad := forbiddenDeps(t, root, bin); len(bad) > 0 {
			t.Errorf("%s links %d forbidden packages, e.g. %v", bin, len(bad), bad[:min(5, len(bad))])
		}
	}
	if checked == 0 {
		t.Fatal("no production binary found to check")
	}
}

// The guard must be able to fail: localcluster is the package that links the
// API server, so the same check has to flag it.
func TestBoundaryCheckFlagsTheTestControlPlane(t *testing.T) {
	bad := forbiddenDeps(t, repoRoot(t), "internal/localcluster")
	if !slices.ContainsFunc(bad, func(p string) bool { return strings.HasPrefix(p, "k8s.io/kubernetes/") }) {
		t.Fatalf("check did not flag k8s.io/kubernetes in internal/localcluster; got %v", bad)
	}
	if !slices.ContainsFunc(bad, func(p string) bool { return strings.HasPrefix(p, "go.etcd.io/etcd/server") }) {
		t.Fatalf("check did not flag etcd server in internal/localcluster; got %v", bad)
	}
}
