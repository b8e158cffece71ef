package attacher

import (
	"strings"
	"testing"

	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/testutil"
)

// Each process that runs an attacher makes its metrics and registers them
// with its own registry (cmd/csi-attacher: the legacy registry; latch-local
// and the tests: once per process). Two sets in one process, each in its
// registry, do not collide, and latch_attacher_competing_instances is
// among them: package app, which sets it, registers nothing.
func TestMetrics_twoAttachersInOneProcessEachRegisterWithTheirOwnRegistry(t *testing.T) {
	regA, regB := metrics.NewKubeRegistry(), metrics.NewKubeRegistry()
	a, b := NewMetrics(), NewMetrics()
	a.Register(regA.MustRegister)
	b.Register(regB.MustRegister)
	a.competingGauge().Set(1)
	b.competingGauge().Set(0)

	const head = `# HELP latch_attacher_competing_instances [ALPHA] 1 while this csi-attacher, running without --leader-election, sees another identity hold its driver's Lease and therefore does no work; 0 otherwise.
# TYPE latch_attacher_competing_instances gauge
`
	if err := testutil.GatherAndCompare(regA, strings.NewReader(head+"latch_attacher_competing_instances 1\n"), "latch_attacher_competing_instances"); err != nil {
		t.Errorf("registry A: %v", err)
	}
	if err := testutil.GatherAndCompare(regB, strings.NewReader(head+"latch_attacher_competing_instances 0\n"), "latch_attacher_competing_instances"); err != nil {
		t.Errorf("registry B: %v", err)
	}
	if g := (*Metrics)(nil).competingGauge(); g != nil {
		t.Errorf("an attacher without metrics hands Presence gauge %v, want none", g)
	}
}
