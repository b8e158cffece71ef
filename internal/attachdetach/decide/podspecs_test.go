package decide_test

import (
	"fmt"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/latchcsi/latch/internal/attachdetach/decide"
	"github.com/latchcsi/latch/internal/attachdetach/state"
	"github.com/latchcsi/latch/internal/attachdetach/volume"
)

// podSpecs is what a Pod's volumes resolve to, in its spec order, through
// volume.Attachables as the controller's Pod pass hands them to the
// desired state.
func podSpecs(specs ...volume.Attachable) []volume.Attachable {
	results := make([]volume.Result, 0, len(specs))
	for i, s := range specs {
		results = append(results, volume.Result{PodVolume: fmt.Sprintf("vol-%d", i), Status: volume.StatusAttach, Volume: s})
	}
	return volume.Attachables(results)
}

// One Pod names one volume handle through two PVs, one ReadWriteMany and
// one ReadWriteOnce. Whatever their order in the Pod, the volume is
// exclusive: a second Pod on node B using the RWX PV alone waits with the
// Multi-Attach event until node A has detached. The spec the Pod's
// VolumeAttachment and events name is the RWO PV in both orders.
func TestScenarioOnePodNamingOneHandleThroughRWXAndRWOPVs_exclusiveInEitherOrder(t *testing.T) {
	rwx := alias(v1.ReadWriteMany) // pv2
	for _, tc := range []struct {
		name  string
		specs []volume.Attachable
	}{
		{"RWX PV listed first", []volume.Attachable{rwx, rwo}},
		{"RWO PV listed first", []volume.Attachable{rwo, rwx}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newStory(t, nodeA, nodeB)
			vol := rwo.UniqueName
			if _, ok := w.dsw.AddPod(podA, nodeA, podSpecs(tc.specs...)); !ok {
				t.Fatal("pod not added")
			}
			wanted, _ := w.dsw.Get(keyOn(nodeA))
			if !slices.Equal(wanted.Pods, []state.PodRef{podA}) || len(wanted.Specs) != 2 || wanted.Volume.PVName != "pv1" {
				t.Fatalf("wanted on node A = %+v; want pod web-0 once, both specs, the RWO PV as the volume's spec", wanted)
			}
			w.sync(vol)
			w.expectWrites("create VA on " + nodeA)
			w.attach(nodeA)
			w.sync(vol)
			w.expectWrites("node " + nodeA + " volumesAttached=1")
			w.expectEvents(`web-0: AttachVolume.Attach succeeded for volume "pv1" `)
			w.asw.SetVolumesInUse(nodeA, []v1.UniqueVolumeName{vol})

			w.addPod(podB, nodeB, rwx)
			for range 2 {
				w.sync(vol)
			}
			w.expectWrites()
			w.expectEvents(`web-1: Multi-Attach error for volume "pv2" Volume is already used by pod(s) web-0`)
			w.dsw.DeletePod(podA.UID)
			w.movesOnceUnmounted(vol, nodeA, nodeB)
		})
	}
}

// The Pod's RWO PV resolves only after the volume was attached through
// its RWX PV (the claim was not yet bound in the controller's cache when
// the Pod first passed). The attachment becomes exclusive once the Pod
// names the RWO PV: after the Pod is gone, a Pod on node B that uses the
// RWX PV still waits for node A's detach. Without that, node A's entry
// keeps the RWX spec it was attached with, the volume counts as
// shareable, and node B gets it while node A still has it.
func TestScenarioRWOSpecResolvedAfterTheAttachMakesTheAttachmentExclusive(t *testing.T) {
	rwx := alias(v1.ReadWriteMany) // pv2
	w := newStory(t, nodeA, nodeB)
	vol := rwo.UniqueName
	if _, ok := w.dsw.AddPod(podA, nodeA, podSpecs(rwx)); !ok {
		t.Fatal("pod not added")
	}
	w.sync(vol)
	w.expectWrites("create VA on " + nodeA)
	w.attach(nodeA)
	w.sync(vol)
	w.expectWrites("node " + nodeA + " volumesAttached=1")
	w.expectEvents(`web-0: AttachVolume.Attach succeeded for volume "pv2" `)
	w.asw.SetVolumesInUse(nodeA, []v1.UniqueVolumeName{vol})

	// The Pod's next pass resolves both PVs.
	w.dsw.AddPod(podA, nodeA, podSpecs(rwo, rwx))
	w.sync(vol)
	w.expectWrites()
	if a, ok := w.asw.Get(keyOn(nodeA)); !ok || a.Spec == nil || a.Spec.MultiAttachAllowed() {
		t.Fatalf("actual state of node A = %+v, want the exclusive spec recorded", a)
	}

	w.dsw.DeletePod(podA.UID)
	w.sync(vol)
	w.addPod(podB, nodeB, rwx)
	for range 2 {
		w.sync(vol)
	}
	w.expectWrites()
	w.expectEvents(`web-1: Multi-Attach error for volume "pv2" Volume is already exclusively attached to one node and can't be attached to another`)
	w.movesOnceUnmounted(vol, nodeA, nodeB)
}

// FuzzDecideOnePodSpecOrder builds the desired and actual state of one
// volume handle from Pods that each name it through a few specs (PVs of
// several access modes, repeated or not, in any order), as the Pod pass
// does, and decides for a second node while the first has it attached.
// The invariant, against a naive reference: a volume is exclusive as soon
// as any spec any Pod names it by is, and the plan does not depend on the
// order of a Pod's volumes.
func FuzzDecideOnePodSpecOrder(f *testing.F) {
	pool := []volume.Attachable{rwo, alias(v1.ReadWriteMany), testVolume(v1.ReadOnlyMany), testVolume(v1.ReadWriteOncePod), testVolume()}
	pool[2].PVName, pool[2].SpecName = "pv3", "pv3"
	pool[3].PVName, pool[3].SpecName = "pv4", "pv4"
	pool[4].PVName, pool[4].SpecName = "pv5", "pv5"
	f.Add([]byte{1, 0, 1})
	f.Add([]byte{0, 1, 1})
	f.Add([]byte{1, 1, 0, 2, 1, 1})
	f.Add([]byte{2, 2, 4, 1, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		b := &bits{data: data}
		pick := func() []volume.Attachable {
			out := []volume.Attachable{pool[b.next(len(pool))]}
			for range b.next(3) {
				out = append(out, pool[b.next(len(pool))])
			}
			return out
		}
		onA, onB := pick(), pick()
		exclusive := slices.ContainsFunc(append(slices.Clone(onA), onB...), naiveSingleNode)

		plan := func(onA, onB []volume.Attachable) decide.Plan {
			dsw, asw := state.NewDesired(), state.NewActual()
			dsw.AddNode(nodeA, true)
			dsw.AddNode(nodeB, true)
			dsw.AddPod(podA, nodeA, podSpecs(onA...))
			dsw.AddPod(podB, nodeB, podSpecs(onB...))
			// Node A has the volume attached through the spec its Pod's
			// pass recorded, as Decide records it.
			wanted, _ := dsw.Get(keyOn(nodeA))
			asw.Apply(keyOn(nodeA), state.Update{State: state.StateAttached, ReportedInNodeStatus: true, Spec: &wanted.Volume})
			in := decide.Gather(keyOn(nodeB), dsw, asw)
			in.Node, in.Config, in.Now = ready, decide.DefaultConfig(), t0
			return decide.Decide(in)
		}
		p := plan(onA, onB)
		if exclusive && p.Kind != decide.KindConflict {
			t.Fatalf("node A %v, node B %v: plan %v on node B, want a conflict (a spec is single-node)", modesOf(onA), modesOf(onB), p.Kind)
		}
		if !exclusive && p.Kind != decide.KindCreate {
			t.Fatalf("node A %v, node B %v: plan %v on node B, want a create (every spec may be shared)", modesOf(onA), modesOf(onB), p.Kind)
		}
		slices.Reverse(onA)
		slices.Reverse(onB)
		if again := plan(onA, onB); again.Kind != p.Kind || len(again.Events) != len(p.Events) {
			t.Fatalf("the order of the Pods' volumes changed the plan: %v, reversed %v", p.Kind, again.Kind)
		}
	})
}

// naiveSingleNode is the access-mode rule written out: known modes, none
// of them ReadWriteMany or ReadOnlyMany.
func naiveSingleNode(a volume.Attachable) bool {
	if len(a.AccessModes) == 0 {
		return false
	}
	for _, m := range a.AccessModes {
		if m == v1.ReadWriteMany || m == v1.ReadOnlyMany {
			return false
		}
	}
	return true
}

func modesOf(specs []volume.Attachable) [][]v1.PersistentVolumeAccessMode {
	out := make([][]v1.PersistentVolumeAccessMode, 0, len(specs))
	for _, s := range specs {
		out = append(out, s.AccessModes)
	}
	return out
}
