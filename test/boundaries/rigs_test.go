package boundaries

import (
	"slices"
	"testing"
)

// testRigs are the packages that assemble and break the stack for tests,
// bench and latch-local: no production binary may link them.
var testRigs = []string{
	"github.com/latchcsi/latch/internal/testsupport",
	"github.com/latchcsi/latch/internal/stack",
}

// rigDeps lists the test rigs pkg links.
func rigDeps(t *testing.T, pkg string) []string {
	t.Helper()
	return depsUnder(t, repoRoot(t), pkg, testRigs)
}

func TestProductionBinariesDoNotLinkTheTestRigs(t *testing.T) {
	for _, bin := range []string{"cmd/csi-attacher", "cmd/attachdetach-controller", "cmd/latchctl"} {
		if found := rigDeps(t, bin); len(found) > 0 {
			t.Errorf("%s links the test rigs %v", bin, found)
		}
	}
}

// The guard must be able to fail: bench runs its components through the
// stack builder and records writes through testsupport.
func TestRigCheckFlagsBench(t *testing.T) {
	found := rigDeps(t, "bench")
	for _, rig := range testRigs {
		if !slices.Contains(found, rig) {
			t.Errorf("check did not flag %s in bench; got %v", rig, found)
		}
	}
}
