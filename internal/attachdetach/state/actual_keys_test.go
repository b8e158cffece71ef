package state_test

import (
	"cmp"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/latchcsi/latch/internal/attachdetach/state"
)

// The verify pass reads each key's state and every key through the light
// accessors; they must agree with Get and Keys.
func TestActual_stateOfAndKeysAnyOrderAgreeWithGetAndKeys(t *testing.T) {
	a := state.NewActual()
	keys := []state.Key{
		{Volume: v1.UniqueVolumeName("kubernetes.io/csi/d^b"), Node: "n2"},
		{Volume: v1.UniqueVolumeName("kubernetes.io/csi/d^a"), Node: "n1"},
		{Volume: v1.UniqueVolumeName("kubernetes.io/csi/d^a"), Node: "n3"},
	}
	states := []state.AttachState{state.StateAttached, state.StateAttaching, state.StateDetaching}
	for i, k := range keys {
		a.Apply(k, state.Update{State: states[i]})
	}
	for _, k := range keys {
		got, ok := a.StateOf(k)
		want, wantOK := a.Get(k)
		if ok != wantOK || got != want.State {
			t.Errorf("StateOf(%v) = %v, %v; Get says %v, %v", k, got, ok, want.State, wantOK)
		}
	}
	if st, ok := a.StateOf(state.Key{Volume: "kubernetes.io/csi/d^none", Node: "n1"}); ok || st != 0 {
		t.Errorf("StateOf(an unknown key) = %v, %v; want the zero state and false", st, ok)
	}
	unordered := a.KeysAnyOrder()
	slices.SortFunc(unordered, func(x, y state.Key) int {
		if x.Volume != y.Volume {
			return cmp.Compare(x.Volume, y.Volume)
		}
		return cmp.Compare(x.Node, y.Node)
	})
	if sorted := a.Keys(); !slices.Equal(unordered, sorted) {
		t.Errorf("KeysAnyOrder sorted = %v, want Keys' %v", unordered, sorted)
	}
}
