package decide_test

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/latchcsi/latch/internal/attachdetach/decide"
	"github.com/latchcsi/latch/internal/attachdetach/state"
	"github.com/latchcsi/latch/internal/attachdetach/volume"
)

// alias is another PV ("pv2") naming rwo's volume handle, with other
// access modes: the same unique volume.
func alias(modes ...v1.PersistentVolumeAccessMode) volume.Attachable {
	a := testVolume(modes...)
	a.PVName, a.SpecName = "pv2", "pv2"
	return a
}

func wantsAll(v volume.Attachable, specs []volume.Attachable, pods ...state.PodRef) *state.Wanted {
	return &state.Wanted{Volume: v, Specs: specs, Pods: pods}
}

func specs(v ...volume.Attachable) []volume.Attachable { return v }

// TestDecideExclusivePerUniqueVolume: a unique volume is exclusive when
// any spec that names it is (desired on any node, or recorded with an
// attachment), not only the spec of the PV being attached.
func TestDecideExclusivePerUniqueVolume(t *testing.T) {
	rwx, rox, inline := alias(v1.ReadWriteMany), alias(v1.ReadOnlyMany), alias()
	rwxOnA := rwo
	rwxOnA.AccessModes = []v1.PersistentVolumeAccessMode{v1.ReadWriteMany}
	multiAttachB := "multi-attach/" + keyOn(nodeB).String()
	usedByWeb0 := func(spec string) []decide.Event {
		return []decide.Event{event(podB, v1.EventTypeWarning, "FailedAttachVolume",
			`Multi-Attach error for volume "`+spec+`" Volume is already used by pod(s) web-0`, multiAttachB)}
	}
	// conflictsWithRWOOnA: podB wants alias on node B while podA has the
	// RWO PV of the same handle (at st) on node A.
	conflictsWithRWOOnA := func(name string, alias volume.Attachable, st state.AttachState) planCase {
		return planCase{name: name,
			in: decide.Input{Wanted: wants(alias, podB),
				Peers: []decide.Peer{{Node: nodeA, State: st, Pods: []state.PodRef{podA}, Specs: specs(rwo)}}},
			want: decide.Plan{Kind: decide.KindConflict, Events: usedByWeb0("pv2")}}
	}
	create := func(v volume.Attachable) decide.Plan {
		return decide.Plan{Kind: decide.KindCreate, Actual: upd(state.StateAttaching, false, time.Time{}, &v), Create: v.VolumeAttachment(nodeB)}
	}

	// Key is keyOn(nodeB), Node ready, Config default, Now t0.
	tests := []planCase{
		conflictsWithRWOOnA("RWX alias on node B while the RWO PV of the handle is attached on node A → conflict naming the pod, no VA", rwx, state.StateAttached),
		conflictsWithRWOOnA("ROX alias on node B while the RWO PV is still attaching on node A → conflict", rox, state.StateAttaching),
		conflictsWithRWOOnA("alias without access modes on node B while the RWO PV is attached on node A → conflict", inline, state.StateAttached),
		{
			name: "RWX alias on node B, node A's pod is gone but its attachment was made through the RWO PV → conflict, exclusively-attached text",
			in: decide.Input{Wanted: wants(rwx, podB),
				Peers: []decide.Peer{{Node: nodeA, State: state.StateAttached, Specs: specs(rwo)}}},
			want: decide.Plan{Kind: decide.KindConflict, Events: []decide.Event{event(podB, v1.EventTypeWarning, "FailedAttachVolume",
				`Multi-Attach error for volume "pv2" Volume is already exclusively attached to one node and can't be attached to another`, multiAttachB)}},
		},
		{
			name: "RWX alias on node B while node A detaches the RWO PV → wait for the detach, Multi-Attach event",
			in: decide.Input{Wanted: wants(rwx, podB),
				Peers: []decide.Peer{{Node: nodeA, State: state.StateDetaching, Specs: specs(rwo)}}},
			want: decide.Plan{Kind: decide.KindConflict, Events: []decide.Event{event(podB, v1.EventTypeWarning, "FailedAttachVolume",
				`Multi-Attach error for volume "pv2" Volume is already exclusively attached to one node and can't be attached to another`, multiAttachB)}},
		},
		{
			name: "RWX alias on node B while RWX is attached on node A and an RWO pod waits on node C → exclusive: conflict with node A",
			in: decide.Input{Wanted: wants(rwx, podB), Peers: []decide.Peer{
				{Node: nodeA, State: state.StateAttached, Pods: []state.PodRef{podA}, Specs: specs(rwxOnA)},
				{Node: "node-c", Pods: []state.PodRef{podX}, Specs: specs(rwo)},
			}},
			want: decide.Plan{Kind: decide.KindConflict, Events: usedByWeb0("pv2")},
		},
		{
			name: "RWX on node B, a second pod on node B names the handle through the RWO PV, RWX attached on node A → conflict",
			in: decide.Input{Wanted: wantsAll(rwx, specs(rwo, rwx), podB),
				Peers: []decide.Peer{{Node: nodeA, State: state.StateAttached, Pods: []state.PodRef{podA}, Specs: specs(rwxOnA)}}},
			want: decide.Plan{Kind: decide.KindConflict, Events: usedByWeb0("pv2")},
		},
		{
			name: "RWX on node B whose earlier attachment there was recorded with the RWO PV, RWX attached on node A → conflict, entry kept",
			in: decide.Input{Wanted: wants(rwx, podB),
				Actual: &state.Attachment{Key: keyOn(nodeB), Spec: ptrTo(rwo), State: state.StateAttaching, MountedByNode: true},
				Peers:  []decide.Peer{{Node: nodeA, State: state.StateAttached, Pods: []state.PodRef{podA}, Specs: specs(rwxOnA)}}},
			want: decide.Plan{Kind: decide.KindConflict, Events: usedByWeb0("pv2")},
		},
		{
			name: "RWX alias on node B while the RWO PV is only wanted on node A, not attached → node B may attach (node A will wait)",
			in: decide.Input{Wanted: wants(rwx, podB),
				Peers: []decide.Peer{{Node: nodeA, Pods: []state.PodRef{podA}, Specs: specs(rwo)}}},
			want: create(rwx),
		},
		{
			name: "RWX alias on node B while an RWX PV of the handle is attached on node A → allowed, create",
			in: decide.Input{Wanted: wants(rwx, podB),
				Peers: []decide.Peer{{Node: nodeA, State: state.StateAttached, Pods: []state.PodRef{podA}, Specs: specs(rwxOnA)}}},
			want: create(rwx),
		},
		{
			name: "RWO on node B while the RWX alias is attached on node A → conflict (the spec being attached is exclusive)",
			in: decide.Input{Key: state.Key{Volume: rwo.UniqueName, Node: nodeB}, Wanted: wants(rwo, podB),
				Peers: []decide.Peer{{Node: nodeA, State: state.StateAttached, Pods: []state.PodRef{podA}, Specs: specs(rwx)}}},
			want: decide.Plan{Kind: decide.KindConflict, Events: usedByWeb0("pv1")},
		},
	}
	checkPlans(t, tests, func(in *decide.Input) {
		in.Key, in.Node, in.Config, in.Now = keyOn(nodeB), ready, decide.DefaultConfig(), t0
	})
}

// TestDecideUnknownCreateOutcome: a VolumeAttachment whose create ended
// without a clear answer may exist. Until the API server says whether it
// does, the key keeps its attachment (which blocks an exclusive volume
// elsewhere) and neither forgets it nor creates it again.
func TestDecideUnknownCreateOutcome(t *testing.T) {
	mayExist := decide.VAFacts{MayExist: true}
	// Key is keyOn(nodeA), Config default, Now t0.
	tests := []planCase{
		{
			name: "Pod gone while our create's outcome is unknown and the informer shows nothing → keep attaching, wait (not forgotten)",
			in:   decide.Input{Actual: entry(state.StateAttaching, false, false), Node: ready, VA: mayExist},
			want: decide.Plan{Kind: decide.KindWait},
		},
		{
			name: "Pod gone, outcome unknown, node gone too → keep, wait",
			in:   decide.Input{Actual: entry(state.StateAttaching, false, true), Node: gone, VA: mayExist},
			want: decide.Plan{Kind: decide.KindWait},
		},
		{
			name: "outcome unknown and no entry at all → recorded uncertain, wait",
			in:   decide.Input{Node: ready, VA: mayExist},
			want: decide.Plan{Kind: decide.KindWait, Actual: upd(state.StateUncertain, false, time.Time{}, nil)},
		},
		{
			name: "still wanted, outcome unknown → wait, no second create",
			in:   decide.Input{Wanted: wants(rwo, podA), Actual: entry(state.StateAttaching, false, true), Node: ready, VA: mayExist},
			want: decide.Plan{Kind: decide.KindWait},
		},
		{
			name: "wanted again after the Pod went, outcome unknown → wait, detach timer cleared",
			in:   decide.Input{Wanted: wants(rwo, podA), Actual: requested(entry(state.StateAttaching, false, true), t0.Add(-time.Minute)), Node: ready, VA: mayExist},
			want: decide.Plan{Kind: decide.KindWait, Actual: upd(state.StateAttaching, false, time.Time{}, nil)},
		},
		{
			name: "the API server says it does not exist (MayExist cleared) → forgotten as before",
			in:   decide.Input{Actual: entry(state.StateAttaching, false, false), Node: ready},
			want: decide.Plan{Kind: decide.KindForget, Actual: &state.Update{Remove: true}},
		},
	}
	checkPlans(t, tests, func(in *decide.Input) {
		in.Key, in.Config, in.Now = keyOn(nodeA), decide.DefaultConfig(), t0
	})
}

// TestScenarioAliasPVsOfOneHandle tells the red team's story through the
// real state caches and Gather: the RWO PV attached on node A, then a Pod
// on node B using a ReadWriteMany PV with the same volume handle. Node B
// waits (Multi-Attach, once) until node A has detached, then attaches.
func TestScenarioAliasPVsOfOneHandle(t *testing.T) {
	for _, tc := range []struct {
		name         string
		first, later volume.Attachable
		event        string
	}{
		{"RWO attached on node A, RWX alias on node B", rwo, alias(v1.ReadWriteMany),
			`web-1: Multi-Attach error for volume "pv2" Volume is already used by pod(s) web-0`},
		{"RWX attached on node A, RWO alias on node B", alias(v1.ReadWriteMany), rwo,
			`web-1: Multi-Attach error for volume "pv1" Volume is already used by pod(s) web-0`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newStory(t, nodeA, nodeB)
			vol := rwo.UniqueName
			w.attachedAndMounted(podA, nodeA, tc.first)

			w.addPod(podB, nodeB, tc.later)
			w.sync(vol)
			w.sync(vol)
			w.expectWrites()
			w.expectEvents(tc.event)

			w.dsw.DeletePod(podA.UID)
			w.movesOnceUnmounted(vol, nodeA, nodeB)
		})
	}
}
