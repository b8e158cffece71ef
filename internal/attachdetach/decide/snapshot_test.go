package decide_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/latchcsi/latch/internal/attachdetach/decide"
	"github.com/latchcsi/latch/internal/attachdetach/state"
	"github.com/latchcsi/latch/internal/attachdetach/volume"
)

// TestGather_aChangeAfterTheSnapshotDoesNotReachTheDecision: Gather
// copies; the decision never reads the live caches, so a Pod added or an
// entry changed while it runs changes nothing it sees.
func TestGather_aChangeAfterTheSnapshotDoesNotReachTheDecision(t *testing.T) {
	dsw, asw := state.NewDesired(), state.NewActual()
	for _, n := range []string{nodeA, nodeB} {
		dsw.AddNode(n, true)
	}
	dsw.AddPod(podA, nodeA, []volume.Attachable{rwo})
	asw.Apply(keyOn(nodeB), state.Update{State: state.StateAttached, Spec: ptrTo(rwo)})

	in := decide.Gather(keyOn(nodeA), dsw, asw)
	before := deepCopyInput(in)

	dsw.AddPod(podB, nodeA, []volume.Attachable{rwo})
	dsw.AddPod(podX, nodeB, []volume.Attachable{rwo})
	asw.Apply(keyOn(nodeB), state.Update{State: state.StateDetaching})
	asw.Apply(keyOn(nodeA), state.Update{State: state.StateAttaching})

	if diff := cmp.Diff(before, in); diff != "" {
		t.Fatalf("the gathered input followed the caches (-before +after):\n%s", diff)
	}
	in.Node = ready
	if p := decide.Decide(in); p.Kind != decide.KindConflict {
		t.Fatalf("decision on the snapshot: %v (%s), want Conflict with the attachment on node B", p.Kind, p.Why)
	}
}

// TestFromSnapshot_peersAreTheOtherNodesWithEverySpec: the key's own
// entries become Wanted and Actual; every other node becomes one Peer,
// sorted, with the specs of its Pods and of its attachment.
func TestFromSnapshot_peersAreTheOtherNodesWithEverySpec(t *testing.T) {
	rwx := testVolume(v1.ReadWriteMany)
	rwx.PVName, rwx.SpecName = "pv2", "pv2"
	s := decide.Snapshot{
		Wanted: []state.NodeWanted{
			{Node: nodeA, Wanted: state.Wanted{Volume: rwx, Specs: []volume.Attachable{rwx}, Pods: []state.PodRef{podA}}},
			{Node: "node-c", Wanted: state.Wanted{Volume: rwx, Specs: []volume.Attachable{rwx}, Pods: []state.PodRef{podX}}},
		},
		Actual: []state.Attachment{
			{Key: keyOn(nodeA), State: state.StateAttaching},
			{Key: keyOn(nodeB), State: state.StateAttached, Spec: ptrTo(rwo)},
			{Key: keyOn("node-c"), State: state.StateAttaching, Spec: ptrTo(rwo)},
		},
	}
	got := decide.FromSnapshot(keyOn(nodeA), s)
	want := decide.Input{
		Key:    keyOn(nodeA),
		Wanted: &state.Wanted{Volume: rwx, Specs: []volume.Attachable{rwx}, Pods: []state.PodRef{podA}},
		Actual: &state.Attachment{Key: keyOn(nodeA), State: state.StateAttaching},
		Peers: []decide.Peer{
			{Node: nodeB, State: state.StateAttached, Specs: []volume.Attachable{rwo}},
			{Node: "node-c", State: state.StateAttaching, Pods: []state.PodRef{podX}, Specs: []volume.Attachable{rwo, rwx}},
		},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("input (-want +got):\n%s", diff)
	}
	if !decide.Exclusive(got) {
		t.Fatal("an RWO alias on another node must make the volume exclusive")
	}
}
