package decide_test

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/attachdetach/decide"
	"github.com/latchcsi/latch/internal/attachdetach/state"
	"github.com/latchcsi/latch/internal/attachdetach/volume"
)

const (
	nodeA = "node-a"
	nodeB = "node-b"
)

var (
	t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

	podA = state.PodRef{Namespace: "ns1", Name: "web-0", UID: "uid-a"}
	podB = state.PodRef{Namespace: "ns1", Name: "web-1", UID: "uid-b"}
	podX = state.PodRef{Namespace: "ns2", Name: "intruder", UID: "uid-x"}

	ready    = decide.NodeFacts{Exists: true, Managed: true, Ready: true}
	notReady = decide.NodeFacts{Exists: true, Managed: true}
	gone     = decide.NodeFacts{}
)

// testVolume is the volume of PV "pv1" with the given access modes.
func testVolume(modes ...v1.PersistentVolumeAccessMode) volume.Attachable {
	a := volume.NewAttachable("csi.example.com", "h1")
	a.PVName, a.SpecName, a.AccessModes = "pv1", "pv1", modes
	return a
}

var (
	rwo    = testVolume(v1.ReadWriteOnce)
	vaName = rwo.AttachmentName(nodeA)
)

func keyOn(node string) state.Key { return state.Key{Volume: rwo.UniqueName, Node: node} }

func wants(v volume.Attachable, pods ...state.PodRef) *state.Wanted {
	return &state.Wanted{Volume: v, Pods: pods}
}

// entry is an ASW entry on node A with a known spec.
func entry(st state.AttachState, reported, mounted bool) *state.Attachment {
	v := rwo
	return &state.Attachment{Key: keyOn(nodeA), Spec: &v, State: st, ReportedInNodeStatus: reported, MountedByNode: mounted}
}

func requested(e *state.Attachment, at time.Time) *state.Attachment {
	e.DetachRequestedAt = at
	return e
}

var (
	vaAttached  = decide.VAFacts{Exists: true, Attached: true}
	vaPending   = decide.VAFacts{Exists: true}
	vaDeleting  = decide.VAFacts{Exists: true, Attached: true, Deleting: true}
	attachError = &storagev1.VolumeError{Time: metav1.NewTime(t0), Message: "rpc error: code = Internal desc = boom"}
)

func upd(st state.AttachState, reported bool, detachAt time.Time, spec *volume.Attachable) *state.Update {
	return &state.Update{State: st, ReportedInNodeStatus: reported, DetachRequestedAt: detachAt, Spec: spec}
}

func ptrTo[T any](v T) *T { return &v }

func event(pod state.PodRef, typ, reason, msg, dedupe string) decide.Event {
	return decide.Event{Pod: pod, Type: typ, Reason: reason, Message: msg, DedupeKey: dedupe}
}

// attachedOnA is the plan that confirms podA's attachment of pv1 on node
// A, with its SuccessfulAttachVolume event.
func attachedOnA() decide.Plan {
	return decide.Plan{Kind: decide.KindMarkAttached, Actual: upd(state.StateAttached, true, time.Time{}, nil), Events: []decide.Event{
		event(podA, v1.EventTypeNormal, "SuccessfulAttachVolume", `AttachVolume.Attach succeeded for volume "pv1" `, "attached/"+keyOn(nodeA).String()),
	}}
}

// planCase is one row of a Decide table: the input (completed by the
// table's defaults) and the plan wanted (Key and Why are not compared).
type planCase struct {
	name string
	in   decide.Input
	want decide.Plan
	// then, when set, is the plan of the next pass: want.Actual applied
	// to the entry and the node status written without the volume (a
	// detach held back for the node status goes ahead then).
	then *decide.Plan
}

// checkPlans runs Decide on each case's input, completed by fill, and
// compares the plan with the one wanted; every plan must carry the input's
// key and say why.
func checkPlans(t *testing.T, cases []planCase, fill func(*decide.Input)) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := tc.in
			fill(&in)
			got := decide.Decide(in)
			if got.Key != in.Key {
				t.Errorf("plan key = %v, want %v", got.Key, in.Key)
			}
			if got.Why == "" {
				t.Error("plan without Why")
			}
			if diff := cmp.Diff(tc.want, got, cmpopts.IgnoreFields(decide.Plan{}, "Key", "Why"), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("plan mismatch (-want +got):\n%s", diff)
			}
			if tc.then == nil {
				return
			}
			next := in
			if u := got.Actual; u != nil && in.Actual != nil {
				a := *in.Actual
				a.State, a.ReportedInNodeStatus, a.DetachRequestedAt = u.State, u.ReportedInNodeStatus, u.DetachRequestedAt
				next.Actual = &a
			}
			next.NodeStatusMayList = false
			if diff := cmp.Diff(*tc.then, decide.Decide(next), cmpopts.IgnoreFields(decide.Plan{}, "Key", "Why"), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("next pass, node status written: plan mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDecide(t *testing.T) {
	cfg := decide.DefaultConfig()
	noForce := cfg
	noForce.DisableForceDetachOnTimeout = true
	multiAttachB := "multi-attach/" + keyOn(nodeB).String()

	// Key defaults to keyOn(nodeA), Config to cfg, Now is t0.
	tests := []planCase{
		// Attach.
		{
			name: "RWO pod on node A, no VolumeAttachment → record attaching, create it",
			in:   decide.Input{Wanted: wants(rwo, podA), Node: ready},
			want: decide.Plan{Kind: decide.KindCreate, Actual: upd(state.StateAttaching, false, time.Time{}, &rwo), Create: rwo.VolumeAttachment(nodeA)},
		},
		{
			name: "RWO pod on node A, VolumeAttachment attached → mark attached, into node status, SuccessfulAttachVolume",
			in:   decide.Input{Wanted: wants(rwo, podA), Actual: entry(state.StateAttaching, false, true), Node: ready, VA: vaAttached},
			want: attachedOnA(),
		},
		{
			name: "RWO pod on node A, attached and reported → nothing",
			in:   decide.Input{Wanted: wants(rwo, podA), Actual: entry(state.StateAttached, true, true), Node: ready, VA: vaAttached},
			want: decide.Plan{Kind: decide.KindNothing},
		},
		{
			name: "volume wanted again while waiting for unmount → detach timer cleared, no new event",
			in:   decide.Input{Wanted: wants(rwo, podB), Actual: requested(entry(state.StateAttached, true, true), t0.Add(-time.Minute)), Node: ready, VA: vaAttached},
			want: decide.Plan{Kind: decide.KindMarkAttached, Actual: upd(state.StateAttached, true, time.Time{}, nil)},
		},
		{
			name: "VolumeAttachment found at start (uncertain) is attached and wanted → confirmed, reported",
			in:   decide.Input{Wanted: wants(rwo, podA), Actual: entry(state.StateUncertain, false, true), Node: ready, VA: vaAttached},
			want: attachedOnA(),
		},
		{
			name: "VolumeAttachment not attached yet → wait for the attacher",
			in:   decide.Input{Wanted: wants(rwo, podA), Actual: entry(state.StateAttaching, false, true), Node: ready, VA: vaPending},
			want: decide.Plan{Kind: decide.KindWait, AttachWaiting: true, RequeueAfter: decide.AttachTimeout},
		},
		{
			name: "unknown VolumeAttachment, wanted, not attached → recorded uncertain, wait",
			in:   decide.Input{Wanted: wants(rwo, podA), Node: ready, VA: vaPending},
			want: decide.Plan{Kind: decide.KindWait, AttachWaiting: true, RequeueAfter: decide.AttachTimeout, Actual: upd(state.StateUncertain, false, time.Time{}, &rwo)},
		},
		{
			name: "attachError on the VolumeAttachment → FailedAttachVolume event with the upstream text",
			in:   decide.Input{Wanted: wants(rwo, podA, podB), Actual: entry(state.StateAttaching, false, true), Node: ready, VA: decide.VAFacts{Exists: true, AttachError: attachError}},
			want: decide.Plan{Kind: decide.KindAttachError, Events: []decide.Event{
				event(podA, v1.EventTypeWarning, "FailedAttachVolume", `AttachVolume.Attach failed for volume "pv1" : rpc error: code = Internal desc = boom`, "attach-error/"+keyOn(nodeA).String()+"/2026-01-01T12:00:00Z/rpc error: code = Internal desc = boom"),
				event(podB, v1.EventTypeWarning, "FailedAttachVolume", `AttachVolume.Attach failed for volume "pv1" : rpc error: code = Internal desc = boom`, "attach-error/"+keyOn(nodeA).String()+"/2026-01-01T12:00:00Z/rpc error: code = Internal desc = boom"),
			}},
		},
		{
			name: "VolumeAttachment being deleted while wanted → wait for it to go, out of node status",
			in:   decide.Input{Wanted: wants(rwo, podA), Actual: entry(state.StateAttached, true, true), Node: ready, VA: vaDeleting},
			want: decide.Plan{Kind: decide.KindWait, Actual: upd(state.StateDetaching, false, time.Time{}, nil)},
		},
		{
			name: "ASW says attached but the VolumeAttachment is gone → re-create, out of node status",
			in:   decide.Input{Wanted: wants(rwo, podA), Actual: entry(state.StateAttached, true, true), Node: ready},
			want: decide.Plan{Kind: decide.KindCreate, Actual: upd(state.StateAttaching, false, time.Time{}, nil), Create: rwo.VolumeAttachment(nodeA)},
		},
		{
			name: "wanted on a node that is not controller-managed → nothing",
			in:   decide.Input{Wanted: wants(rwo, podA), Node: decide.NodeFacts{Exists: true, Ready: true}},
			want: decide.Plan{Kind: decide.KindNothing},
		},

		// Multi-attach.
		{
			name: "RWX on node B while attached on node A → allowed, create",
			in: decide.Input{Key: keyOn(nodeB), Wanted: wants(testVolume(v1.ReadWriteMany), podB), Node: ready,
				Peers: []decide.Peer{{Node: nodeA, State: state.StateAttached, Pods: []state.PodRef{podA}}}},
			want: decide.Plan{Kind: decide.KindCreate, Actual: upd(state.StateAttaching, false, time.Time{}, ptrTo(testVolume(v1.ReadWriteMany))), Create: ptrTo(testVolume(v1.ReadWriteMany)).VolumeAttachment(nodeB)},
		},
		{
			name: "ROX on node B while attached on node A → allowed, create",
			in: decide.Input{Key: keyOn(nodeB), Wanted: wants(testVolume(v1.ReadOnlyMany), podB), Node: ready,
				Peers: []decide.Peer{{Node: nodeA, State: state.StateAttached, Pods: []state.PodRef{podA}}}},
			want: decide.Plan{Kind: decide.KindCreate, Actual: upd(state.StateAttaching, false, time.Time{}, ptrTo(testVolume(v1.ReadOnlyMany))), Create: ptrTo(testVolume(v1.ReadOnlyMany)).VolumeAttachment(nodeB)},
		},
		{
			name: "no access modes (inline) on node B while attached on node A → no multi-attach check, create",
			in: decide.Input{Key: keyOn(nodeB), Wanted: wants(testVolume(), podB), Node: ready,
				Peers: []decide.Peer{{Node: nodeA, State: state.StateAttached, Pods: []state.PodRef{podA}}}},
			want: decide.Plan{Kind: decide.KindCreate, Actual: upd(state.StateAttaching, false, time.Time{}, ptrTo(testVolume())), Create: ptrTo(testVolume()).VolumeAttachment(nodeB)},
		},
		{
			name: "RWO on node B while attached on node A by a pod of the same namespace → conflict naming it, no VA",
			in: decide.Input{Key: keyOn(nodeB), Wanted: wants(rwo, podB), Node: ready,
				Peers: []decide.Peer{{Node: nodeA, State: state.StateAttached, Pods: []state.PodRef{podA}}}},
			want: decide.Plan{Kind: decide.KindConflict, Events: []decide.Event{
				event(podB, v1.EventTypeWarning, "FailedAttachVolume", `Multi-Attach error for volume "pv1" Volume is already used by pod(s) web-0`, multiAttachB),
			}},
		},
		{
			name: "RWO on node B, pods on node A in this and another namespace → other namespace only counted",
			in: decide.Input{Key: keyOn(nodeB), Wanted: wants(rwo, podB), Node: ready,
				Peers: []decide.Peer{{Node: nodeA, State: state.StateAttached, Pods: []state.PodRef{podA, podX}}}},
			want: decide.Plan{Kind: decide.KindConflict, Events: []decide.Event{
				event(podB, v1.EventTypeWarning, "FailedAttachVolume", `Multi-Attach error for volume "pv1" Volume is already used by pod(s) web-0 and 1 pod(s) in different namespaces`, multiAttachB),
			}},
		},
		{
			name: "RWO on node B while still attaching on node A → conflict",
			in: decide.Input{Key: keyOn(nodeB), Wanted: wants(rwo, podB), Node: ready,
				Peers: []decide.Peer{{Node: nodeA, State: state.StateAttaching, Pods: []state.PodRef{podA}}}},
			want: decide.Plan{Kind: decide.KindConflict, Events: []decide.Event{
				event(podB, v1.EventTypeWarning, "FailedAttachVolume", `Multi-Attach error for volume "pv1" Volume is already used by pod(s) web-0`, multiAttachB),
			}},
		},
		{
			name: "RWO on node B, uncertain on node A and no pod there → conflict, exclusively-attached text",
			in: decide.Input{Key: keyOn(nodeB), Wanted: wants(rwo, podB), Node: ready,
				Peers: []decide.Peer{{Node: nodeA, State: state.StateUncertain}}},
			want: decide.Plan{Kind: decide.KindConflict, Events: []decide.Event{
				event(podB, v1.EventTypeWarning, "FailedAttachVolume", `Multi-Attach error for volume "pv1" Volume is already exclusively attached to one node and can't be attached to another`, multiAttachB),
			}},
		},
		{
			name: "RWO on node B, a pod on node A wants it but nothing is attached there → create on B",
			in: decide.Input{Key: keyOn(nodeB), Wanted: wants(rwo, podB), Node: ready,
				Peers: []decide.Peer{{Node: nodeA, Pods: []state.PodRef{podA}}}},
			want: decide.Plan{Kind: decide.KindCreate, Actual: upd(state.StateAttaching, false, time.Time{}, &rwo), Create: rwo.VolumeAttachment(nodeB)},
		},
		{
			// kube-controller-manager keeps the volume in its actual state
			// until the detach succeeded, and reports it the same way.
			name: "RWO on node B while detaching from node A → wait, Multi-Attach with the exclusively-attached text",
			in: decide.Input{Key: keyOn(nodeB), Wanted: wants(rwo, podB), Node: ready,
				Peers: []decide.Peer{{Node: nodeA, State: state.StateDetaching}}},
			want: decide.Plan{Kind: decide.KindConflict, Events: []decide.Event{
				event(podB, v1.EventTypeWarning, "FailedAttachVolume", `Multi-Attach error for volume "pv1" Volume is already exclusively attached to one node and can't be attached to another`, multiAttachB),
			}},
		},
		{
			name: "RWO on node B while node A detaches it under a pod that still wants it, and uncertain on node C → Multi-Attach names the pod",
			in: decide.Input{Key: keyOn(nodeB), Wanted: wants(rwo, podB), Node: ready,
				Peers: []decide.Peer{{Node: nodeA, State: state.StateDetaching, Pods: []state.PodRef{podA}}, {Node: "node-c", State: state.StateUncertain}}},
			want: decide.Plan{Kind: decide.KindConflict, Events: []decide.Event{
				event(podB, v1.EventTypeWarning, "FailedAttachVolume", `Multi-Attach error for volume "pv1" Volume is already used by pod(s) web-0`, multiAttachB),
			}},
		},
		{
			name: "RWO attached on both nodes (found so) → this node's attachment is confirmed anyway",
			in: decide.Input{Wanted: wants(rwo, podA), Actual: entry(state.StateUncertain, false, true), Node: ready, VA: vaAttached,
				Peers: []decide.Peer{{Node: nodeB, State: state.StateAttached}}},
			want: attachedOnA(),
		},

		// Detach.
		{
			name: "not wanted, nothing attached → nothing",
			in:   decide.Input{Node: ready},
			want: decide.Plan{Kind: decide.KindNothing},
		},
		{
			name: "pod deleted, node no longer uses the volume → out of node status first, then delete the VA",
			in:   decide.Input{Actual: entry(state.StateAttached, true, false), Node: ready, VA: vaAttached},
			want: decide.Plan{Kind: decide.KindWaitForNodeStatus, Actual: upd(state.StateDetaching, false, t0, nil), WakeNodeStatus: true},
			then: &decide.Plan{Kind: decide.KindDetach, Detach: &decide.Detach{Name: vaName, Reason: decide.DetachUnmounted}},
		},
		{
			name: "uncertain attach (VA exists, not attached, not wanted) → detach without node status write",
			in:   decide.Input{Actual: entry(state.StateUncertain, false, false), Node: ready, VA: vaPending},
			want: decide.Plan{Kind: decide.KindDetach, Actual: upd(state.StateDetaching, false, t0, nil),
				Detach: &decide.Detach{Name: vaName, Reason: decide.DetachUnmounted}},
		},
		{
			name: "detaching, no longer reported, but the node status may still list the volume (a write in flight) → wait for the node status",
			in:   decide.Input{Actual: requested(entry(state.StateDetaching, false, false), t0.Add(-time.Second)), Node: ready, VA: vaAttached, NodeStatusMayList: true},
			want: decide.Plan{Kind: decide.KindWaitForNodeStatus, WakeNodeStatus: true},
			then: &decide.Plan{Kind: decide.KindDetach, Detach: &decide.Detach{Name: vaName, Reason: decide.DetachUnmounted}},
		},
		{
			name: "VolumeAttachment unknown to the ASW and not wanted → recorded uncertain (assumed mounted), wait",
			in:   decide.Input{Node: ready, VA: vaPending},
			want: decide.Plan{Kind: decide.KindWait, Actual: upd(state.StateUncertain, false, t0, nil)},
		},
		{
			name: "detach blocked while in volumesInUse on a Ready node → wait for the node, no timer",
			in:   decide.Input{Actual: entry(state.StateAttached, true, true), Node: ready, VA: vaAttached},
			want: decide.Plan{Kind: decide.KindWait, Actual: upd(state.StateAttached, true, t0, nil)},
		},
		{
			name: "still in volumesInUse on a NotReady node, 2m of 6m waited → wait, requeue when the timeout expires",
			in:   decide.Input{Actual: requested(entry(state.StateAttached, true, true), t0.Add(-2*time.Minute)), Node: notReady, VA: vaAttached},
			want: decide.Plan{Kind: decide.KindWait, RequeueAfter: 4 * time.Minute},
		},
		{
			name: "NotReady node and the unmount timeout elapsed → forced detach, reason timeout",
			in:   decide.Input{Actual: requested(entry(state.StateAttached, true, true), t0.Add(-7*time.Minute)), Node: notReady, VA: vaAttached},
			want: decide.Plan{Kind: decide.KindWaitForNodeStatus, Actual: upd(state.StateDetaching, false, t0.Add(-7*time.Minute), nil), WakeNodeStatus: true},
			then: &decide.Plan{Kind: decide.KindDetach, Detach: &decide.Detach{Name: vaName, Reason: decide.DetachForcedTimeout}},
		},
		{
			name: "NotReady node, timer fires exactly at the deadline → forced detach",
			in:   decide.Input{Actual: requested(entry(state.StateAttached, true, true), t0.Add(-6*time.Minute)), Node: notReady, VA: vaAttached},
			want: decide.Plan{Kind: decide.KindWaitForNodeStatus, Actual: upd(state.StateDetaching, false, t0.Add(-6*time.Minute), nil), WakeNodeStatus: true},
			then: &decide.Plan{Kind: decide.KindDetach, Detach: &decide.Detach{Name: vaName, Reason: decide.DetachForcedTimeout}},
		},
		{
			name: "Ready node keeps the volume in use past the timeout → no forced detach",
			in:   decide.Input{Actual: requested(entry(state.StateAttached, true, true), t0.Add(-time.Hour)), Node: ready, VA: vaAttached},
			want: decide.Plan{Kind: decide.KindWait},
		},
		{
			name: "force detach on timeout disabled → keeps waiting, no timer",
			in:   decide.Input{Actual: requested(entry(state.StateAttached, true, true), t0.Add(-time.Hour)), Node: notReady, VA: vaAttached, Config: noForce},
			want: decide.Plan{Kind: decide.KindWait},
		},
		{
			name: "out-of-service taint → immediate detach though mounted and Ready",
			in: decide.Input{Actual: entry(state.StateAttached, true, true), VA: vaAttached,
				Node: decide.NodeFacts{Exists: true, Managed: true, Ready: true, OutOfService: true}},
			want: decide.Plan{Kind: decide.KindWaitForNodeStatus, Actual: upd(state.StateDetaching, false, t0, nil), WakeNodeStatus: true},
			then: &decide.Plan{Kind: decide.KindDetach, Detach: &decide.Detach{Name: vaName, Reason: decide.DetachOutOfService}},
		},
		{
			name: "out-of-service taint with force detach on timeout disabled → still immediate",
			in: decide.Input{Actual: entry(state.StateAttached, true, true), VA: vaAttached, Config: noForce,
				Node: decide.NodeFacts{Exists: true, Managed: true, OutOfService: true}},
			want: decide.Plan{Kind: decide.KindWaitForNodeStatus, Actual: upd(state.StateDetaching, false, t0, nil), WakeNodeStatus: true},
			then: &decide.Plan{Kind: decide.KindDetach, Detach: &decide.Detach{Name: vaName, Reason: decide.DetachOutOfService}},
		},
		{
			name: "out-of-service taint on a NotReady node past the timeout → reason timeout (upstream's precedence)",
			in: decide.Input{Actual: requested(entry(state.StateAttached, true, true), t0.Add(-time.Hour)), VA: vaAttached,
				Node: decide.NodeFacts{Exists: true, Managed: true, OutOfService: true}},
			want: decide.Plan{Kind: decide.KindWaitForNodeStatus, Actual: upd(state.StateDetaching, false, t0.Add(-time.Hour), nil), WakeNodeStatus: true},
			then: &decide.Plan{Kind: decide.KindDetach, Detach: &decide.Detach{Name: vaName, Reason: decide.DetachForcedTimeout}},
		},
		{
			name: "node came back (re-created), its Pods not all recorded again, volume not in its volumesInUse → wait, no timer",
			in: decide.Input{Actual: entry(state.StateAttached, true, false), VA: vaAttached,
				Node: decide.NodeFacts{Exists: true, Managed: true, Ready: true, PodsPending: true}},
			want: decide.Plan{Kind: decide.KindWait},
		},
		{
			name: "node came back NotReady and out of service, its Pods not all recorded again → still wait for them",
			in: decide.Input{Actual: requested(entry(state.StateAttached, true, true), t0.Add(-time.Hour)), VA: vaAttached,
				Node: decide.NodeFacts{Exists: true, Managed: true, OutOfService: true, PodsPending: true}},
			want: decide.Plan{Kind: decide.KindWait},
		},
		{
			name: "node deleted, volume not in its last volumesInUse → detach",
			in:   decide.Input{Actual: entry(state.StateAttached, true, false), Node: gone, VA: vaAttached},
			want: decide.Plan{Kind: decide.KindWaitForNodeStatus, Actual: upd(state.StateDetaching, false, t0, nil), WakeNodeStatus: true},
			then: &decide.Plan{Kind: decide.KindDetach, Detach: &decide.Detach{Name: vaName, Reason: decide.DetachUnmounted}},
		},
		{
			name: "node deleted while pods still want the volume there → detach anyway",
			in:   decide.Input{Wanted: wants(rwo, podA), Actual: entry(state.StateAttached, true, false), Node: gone, VA: vaAttached},
			want: decide.Plan{Kind: decide.KindWaitForNodeStatus, Actual: upd(state.StateDetaching, false, t0, nil), WakeNodeStatus: true},
			then: &decide.Plan{Kind: decide.KindDetach, Detach: &decide.Detach{Name: vaName, Reason: decide.DetachUnmounted}},
		},
		{
			name: "node deleted, volume in its last volumesInUse → wait for the unmount timeout",
			in:   decide.Input{Actual: entry(state.StateAttached, true, true), Node: gone, VA: vaAttached},
			want: decide.Plan{Kind: decide.KindWait, Actual: upd(state.StateAttached, true, t0, nil), RequeueAfter: 6 * time.Minute},
		},
		{
			name: "node deleted, volume in its last volumesInUse, timeout elapsed → forced detach",
			in:   decide.Input{Actual: requested(entry(state.StateAttached, true, true), t0.Add(-6*time.Minute)), Node: gone, VA: vaAttached},
			want: decide.Plan{Kind: decide.KindWaitForNodeStatus, Actual: upd(state.StateDetaching, false, t0.Add(-6*time.Minute), nil), WakeNodeStatus: true},
			then: &decide.Plan{Kind: decide.KindDetach, Detach: &decide.Detach{Name: vaName, Reason: decide.DetachForcedTimeout}},
		},
		{
			name: "VolumeAttachment being deleted, not wanted → wait for csi-attacher",
			in:   decide.Input{Actual: entry(state.StateAttached, true, false), Node: ready, VA: vaDeleting},
			want: decide.Plan{Kind: decide.KindWait, Actual: upd(state.StateDetaching, false, time.Time{}, nil)},
		},
		{
			name: "detaching and the VolumeAttachment is gone → forget",
			in:   decide.Input{Actual: entry(state.StateDetaching, false, false), Node: ready},
			want: decide.Plan{Kind: decide.KindForget, Actual: &state.Update{Remove: true}},
		},
		{
			name: "detaching, VA still there and not deleting (failed delete or cache lag) → delete again",
			in:   decide.Input{Actual: requested(entry(state.StateDetaching, false, false), t0.Add(-time.Second)), Node: ready, VA: vaAttached},
			want: decide.Plan{Kind: decide.KindDetach, Detach: &decide.Detach{Name: vaName, Reason: decide.DetachUnmounted}},
		},
		{
			name: "attaching, pod deleted before the informer showed our VA → forget (its add event brings it back)",
			in:   decide.Input{Actual: entry(state.StateAttaching, false, true), Node: ready},
			want: decide.Plan{Kind: decide.KindForget, Actual: &state.Update{Remove: true}},
		},
		{
			name: "attached per Node.status without a VolumeAttachment, unmounted → forget",
			in:   decide.Input{Actual: entry(state.StateAttached, true, false), Node: ready},
			want: decide.Plan{Kind: decide.KindForget, Actual: &state.Update{Remove: true}},
		},
		{
			name: "attached per Node.status without a VolumeAttachment, still mounted → wait",
			in:   decide.Input{Actual: entry(state.StateAttached, true, true), Node: ready},
			want: decide.Plan{Kind: decide.KindWait, Actual: upd(state.StateAttached, true, t0, nil)},
		},
	}
	checkPlans(t, tests, func(in *decide.Input) {
		if in.Key == (state.Key{}) {
			in.Key = keyOn(nodeA)
		}
		if in.Config.MaxWaitForUnmount == 0 {
			in.Config = cfg
		}
		in.Now = t0
	})
}

func TestMultiAttachMessage(t *testing.T) {
	me := state.PodRef{Namespace: "team-a", Name: "new"}
	tests := []struct {
		name   string
		others []state.PodRef
		want   string
	}{
		{"no pods known", nil,
			`Multi-Attach error for volume "pv1" Volume is already exclusively attached to one node and can't be attached to another`},
		{"pods in the same namespace", []state.PodRef{{Namespace: "team-a", Name: "old-0"}, {Namespace: "team-a", Name: "old-1"}},
			`Multi-Attach error for volume "pv1" Volume is already used by pod(s) old-0, old-1`},
		{"same and other namespaces", []state.PodRef{{Namespace: "team-a", Name: "old-0"}, {Namespace: "team-b", Name: "x"}, {Namespace: "team-c", Name: "y"}},
			`Multi-Attach error for volume "pv1" Volume is already used by pod(s) old-0 and 2 pod(s) in different namespaces`},
		{"only other namespaces: names hidden", []state.PodRef{{Namespace: "team-b", Name: "secret-name"}},
			`Multi-Attach error for volume "pv1" Volume is already used by 1 pod(s) in different namespaces`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := decide.MultiAttachMessage("pv1", me, tc.others); got != tc.want {
				t.Errorf("got  %q\nwant %q", got, tc.want)
			}
		})
	}
}

func TestNodeFactsOf(t *testing.T) {
	tests := []struct {
		name string
		node *v1.Node
		want decide.NodeFacts
	}{
		{"deleted", nil, decide.NodeFacts{}},
		{"bare node", &v1.Node{}, decide.NodeFacts{Exists: true}},
		{"managed, Ready", &v1.Node{
			ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{"volumes.kubernetes.io/controller-managed-attach-detach": "true"}},
			Status:     v1.NodeStatus{Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}}},
		}, decide.NodeFacts{Exists: true, Managed: true, Ready: true}},
		{"Ready unknown", &v1.Node{Status: v1.NodeStatus{Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionUnknown}}}},
			decide.NodeFacts{Exists: true}},
		{"out-of-service NoExecute", &v1.Node{Spec: v1.NodeSpec{Taints: []v1.Taint{{Key: "node.kubernetes.io/out-of-service", Value: "nodeshutdown", Effect: v1.TaintEffectNoExecute}}}},
			decide.NodeFacts{Exists: true, OutOfService: true}},
		{"out-of-service NoSchedule counts too (upstream matches the key)", &v1.Node{Spec: v1.NodeSpec{Taints: []v1.Taint{{Key: "node.kubernetes.io/out-of-service", Effect: v1.TaintEffectNoSchedule}}}},
			decide.NodeFacts{Exists: true, OutOfService: true}},
		{"other taint", &v1.Node{Spec: v1.NodeSpec{Taints: []v1.Taint{{Key: "node.kubernetes.io/unreachable", Effect: v1.TaintEffectNoExecute}}}},
			decide.NodeFacts{Exists: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := decide.NodeFactsOf(tc.node); got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestVAFactsOf(t *testing.T) {
	now := metav1.NewTime(t0)
	va := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &now},
		Status:     storagev1.VolumeAttachmentStatus{Attached: true, DetachError: &storagev1.VolumeError{Message: "x"}},
	}
	got := decide.VAFactsOf(va)
	if !got.Exists || !got.Attached || !got.Deleting || got.DetachError == nil || got.AttachError != nil {
		t.Errorf("got %+v", got)
	}
	if decide.VAFactsOf(nil).Exists {
		t.Error("nil VA exists")
	}
}
