package main

import (
	"slices"
	"testing"

	"k8s.io/component-base/featuregate"
)

func TestParseOptions_upstreamGatesAndLabelsReachTheConfig(t *testing.T) {
	o, err := parseOptions([]string{
		"--feature-gates=ReleaseLeaderElectionOnExit=true,MutableCSINodeAllocatableCount=false,APIResponseCompression=false",
		"--leader-election-labels=app:foo,b:c",
	})
	if err != nil {
		t.Fatal(err)
	}
	if !o.gates.Enabled(releaseLeaderElectionOnExit) || o.gates.Enabled(mutableCSINodeAllocatableCount) {
		t.Errorf("gates not set from --feature-gates")
	}
	if got := leaderConfig(o).Labels; got["app"] != "foo" || got["b"] != "c" || len(got) != 2 {
		t.Errorf("Lease labels = %v, want app=foo, b=c", got)
	}
	want := []featuregate.Feature{"APIResponseCompression", mutableCSINodeAllocatableCount}
	if got := noEffectGates(o.gatesSet); !slices.Equal(got, want) {
		t.Errorf("gates without effect = %v, want %v (ReleaseLeaderElectionOnExit=true holds in latch)", got, want)
	}
	// Logging gates are latch's own and have an effect.
	o, err = parseOptions([]string{"--feature-gates=LoggingBetaOptions=true,ReleaseLeaderElectionOnExit=false"})
	if err != nil {
		t.Fatal(err)
	}
	if got := noEffectGates(o.gatesSet); !slices.Equal(got, []featuregate.Feature{releaseLeaderElectionOnExit}) {
		t.Errorf("gates without effect = %v, want only ReleaseLeaderElectionOnExit (=false)", got)
	}
}
