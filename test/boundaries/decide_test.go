package boundaries

import (
	"os/exec"
	"strings"
	"testing"
)

// decidePackages are the pure decision halves of the two controllers:
// observed facts in, plan out. They must not reach an API server, a driver
// or the wall clock, so they may not link a clientset, gRPC or a clock.
var decidePackages = []string{
	"internal/attacher/decide",
	"internal/attachdetach/decide",
}

// impureDeps are the import paths (and everything under them) a decide
// package must not link: client-go's clientset, gRPC, and the clock
// package (k8s.io/utils/clock; a decision takes the time as a fact).
var impureDeps = []string{
	"k8s.io/client-go/kubernetes",
	"google.golang.org/grpc",
	"k8s.io/utils/clock",
}

// knownImpure lists decide packages that still link one of impureDeps,
// with the path through which they do. The test fails when such a package
// becomes pure (remove it from here) or when another one becomes impure.
var knownImpure = map[string]string{}

// impureDepsOf lists what pkg links of impureDeps.
func impureDepsOf(t *testing.T, root, pkg string) []string {
	t.Helper()
	return depsUnder(t, root, pkg, impureDeps)
}

// depsUnder lists the packages pkg links (go list -deps) that are one of
// prefixes or under one.
func depsUnder(t *testing.T, root, pkg string, prefixes []string) []string {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "./"+pkg)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("go list -deps ./%s: %v\n%s", pkg, err, stderr)
	}
	var bad []string
	for _, dep := range strings.Fields(string(out)) {
		for _, prefix := range prefixes {
			if dep == prefix || strings.HasPrefix(dep, prefix+"/") {
				bad = append(bad, dep)
			}
		}
	}
	return bad
}

func TestDecidePackagesLinkNoClientsetGRPCOrClock(t *testing.T) {
	root := repoRoot(t)
	for _, pkg := range decidePackages {
		bad := impureDepsOf(t, root, pkg)
		via, known := knownImpure[pkg]
		switch {
		case len(bad) > 0 && !known:
			t.Errorf("%s links %d packages a decide package may not (a clientset, gRPC or a clock), e.g. %v", pkg, len(bad), bad[:min(5, len(bad))])
		case len(bad) == 0 && known:
			t.Errorf("%s no longer links a clientset, gRPC or a clock (it did through %s): remove it from knownImpure", pkg, via)
		}
	}
}

// TestImpureDepsCatchesAnImporter keeps the check above from passing
// vacuously: package attacher, which calls the API server and the driver,
// must be caught.
func TestImpureDepsCatchesAnImporter(t *testing.T) {
	root := repoRoot(t)
	bad := impureDepsOf(t, root, "internal/attacher")
	for _, want := range []string{"k8s.io/client-go/kubernetes", "google.golang.org/grpc", "k8s.io/utils/clock"} {
		found := false
		for _, dep := range bad {
			found = found || dep == want
		}
		if !found {
			t.Errorf("internal/attacher links %s, but the check did not report it (reported %d: %v)", want, len(bad), bad[:min(5, len(bad))])
		}
	}
}
