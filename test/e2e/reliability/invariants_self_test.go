package reliability_test

import (
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/latchcsi/latch/internal/csimock"
)

// The checker must be able to fail: a publication nobody asked for and a
// single-node volume on two nodes are reported. (The regression test of an
// exclusive volume moving nodes shows invariant 3 firing on a real bug.)
func TestInvariantChecker_reportsLeakedAndDoublePublications(t *testing.T) {
	e := newEnv(t, options{noController: true})
	n1, n2 := e.addNode("n1"), e.addNode("n2")
	rwo := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	vol := e.prefix + "-leak"
	if err := e.mock.SeedVolume(csimock.VolumeSpec{ID: vol}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{n1, n2} {
		if _, err := e.mock.SeedPublication(vol, e.nodeID(n), false, rwo); err != nil {
			t.Fatal(err)
		}
	}
	w, err := e.read()
	if err != nil {
		t.Fatal(err)
	}
	problems := strings.Join(e.restProblems(w), "\n")
	for _, n := range []string{n1, n2} {
		if !strings.Contains(problems, "invariant 2: the driver still has "+vol+" published to \""+n+"\"") {
			t.Errorf("leaked publication on %s not reported; problems:\n%s", n, problems)
		}
	}
	if p := e.mock.Stats().Publish; p.SingleNodeViolationsTotal != 1 {
		t.Errorf("the driver recorded %d single-node violations, want 1 (what invariant 3 reads)", p.SingleNodeViolationsTotal)
	}
}
