package decide_test

import (
	"reflect"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/latchcsi/latch/internal/attachdetach/decide"
	"github.com/latchcsi/latch/internal/attachdetach/state"
)

// TestDecide_assumedMount covers the correction of an actual state entry
// assumed mounted that the kubelet cannot have mounted (a volume never
// reported in the node's status.volumesAttached, and listed nowhere on the
// Node).
func TestDecide_assumedMount(t *testing.T) {
	nothing := &decide.NodeListing{}
	detachNow := &decide.Plan{Kind: decide.KindDetach, Actual: upd(state.StateDetaching, false, t0, nil),
		Detach: &decide.Detach{Name: vaName, Reason: decide.DetachUnmounted}}
	waitUnmount := &decide.Plan{Kind: decide.KindWait, Actual: upd(state.StateUncertain, false, t0, nil)}
	tests := []struct {
		name string
		in   decide.Input
		want *decide.Plan
	}{
		{
			name: "pod deleted while its volume was attaching, node lists it nowhere → not mounted, detach at once",
			in:   decide.Input{Actual: entry(state.StateUncertain, false, true), Node: ready, VA: vaPending, Listing: nothing},
			want: detachNow,
		},
		{
			name: "same, but the Node was not read (deleted) → the assumption stands, wait for the unmount",
			in:   decide.Input{Actual: entry(state.StateUncertain, false, true), Node: ready, VA: vaPending},
			want: waitUnmount,
		},
		{
			name: "same, but the node reports the volume in volumesInUse → mounted, wait",
			in:   decide.Input{Actual: entry(state.StateUncertain, false, true), Node: ready, VA: vaPending, Listing: &decide.NodeListing{InUse: true}},
			want: waitUnmount,
		},
		{
			name: "same, but the informer's Node lists it in volumesAttached → the kubelet may mount it, wait",
			in:   decide.Input{Actual: entry(state.StateUncertain, false, true), Node: ready, VA: vaPending, Listing: &decide.NodeListing{Attached: true}},
			want: waitUnmount,
		},
		{
			name: "same, but our last or in-flight node status write lists it → the kubelet may mount it, wait",
			in:   decide.Input{Actual: entry(state.StateUncertain, false, true), Node: ready, VA: vaPending, Listing: &decide.NodeListing{Written: true}},
			want: waitUnmount,
		},
		{
			name: "volume reported in node status, listed nowhere → the kubelet was told, the assumption stands",
			in:   decide.Input{Actual: entry(state.StateAttached, true, true), Node: ready, VA: vaAttached, Listing: nothing},
			want: &decide.Plan{Kind: decide.KindWait, Actual: upd(state.StateAttached, true, t0, nil)},
		},
		{
			name: "volume still wanted, listed nowhere → no correction, it is being attached",
			in:   decide.Input{Wanted: wants(rwo, podA), Actual: entry(state.StateAttaching, false, true), Node: ready, VA: vaPending, Listing: nothing},
			want: &decide.Plan{Kind: decide.KindWait, AttachWaiting: true, RequeueAfter: decide.AttachTimeout},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := tt.in
			in.Key, in.Config, in.Now = keyOn(nodeA), decide.DefaultConfig(), t0
			before := deepCopyInput(in)
			got := decide.Decide(in)
			if !reflect.DeepEqual(in.Actual, before.Actual) {
				t.Fatal("Decide changed the caller's actual state entry")
			}
			if diff := cmp.Diff(*tt.want, got, cmpopts.IgnoreFields(decide.Plan{}, "Key", "Why", "RequeueAfter")); diff != "" {
				t.Errorf("plan (-want +got):\n%s", diff)
			}
		})
	}
}

// TestDetachWaitsForNodeStatus covers the rule that a VolumeAttachment
// is deleted only once the node's status.volumesAttached no longer lists
// its volume.
func TestDetachWaitsForNodeStatus(t *testing.T) {
	unlisted := decide.Input{Key: keyOn(nodeA), Actual: requested(entry(state.StateDetaching, false, false), t0), Node: ready, VA: vaAttached,
		Config: decide.DefaultConfig(), Now: t0}
	listed := unlisted
	listed.NodeStatusMayList = true
	reported := unlisted
	reported.Actual = requested(entry(state.StateAttached, true, false), t0)
	wantCreate := decide.Input{Key: keyOn(nodeA), Wanted: wants(rwo, podA), Node: ready, Config: decide.DefaultConfig(), Now: t0, NodeStatusMayList: true}
	tests := []struct {
		name string
		in   decide.Input
		want decide.Plan
	}{
		{
			name: "detach, node status still lists the volume → no delete, wake the node status updater",
			in:   listed,
			want: decide.Plan{Kind: decide.KindWaitForNodeStatus, Key: keyOn(nodeA), Why: "waiting for the node status to drop the volume before detaching",
				WakeNodeStatus: true},
		},
		{
			name: "detach, volume still reported by the actual state → out of the node status first, no delete",
			in:   reported,
			want: decide.Plan{Kind: decide.KindWaitForNodeStatus, Key: keyOn(nodeA), Why: "waiting for the node status to drop the volume before detaching",
				Actual: upd(state.StateDetaching, false, t0, nil), WakeNodeStatus: true},
		},
		{
			name: "detach, volume off the list → delete the VolumeAttachment",
			in:   unlisted,
			want: decide.Plan{Kind: decide.KindDetach, Key: keyOn(nodeA), Why: "volume is no longer wanted on the node",
				Detach: &decide.Detach{Name: vaName, Reason: decide.DetachUnmounted}},
		},
		{
			name: "create while the volume is listed → untouched, only detaches wait",
			in:   wantCreate,
			want: decide.Plan{Kind: decide.KindCreate, Key: keyOn(nodeA), Why: "volume is wanted and has no VolumeAttachment",
				Create: rwo.VolumeAttachment(nodeA), Actual: &state.Update{State: state.StateAttaching, Spec: &rwo}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, decide.Decide(tt.in)); diff != "" {
				t.Errorf("plan (-want +got):\n%s", diff)
			}
		})
	}
}

// FuzzNodeListing checks the invariants of the two node-status rules on
// random inputs: a Listing that lists the volume anywhere never changes
// the decision; an empty one decides exactly as an entry not mounted
// would (only for entries never reported and not wanted); a node status
// that may list the volume never lets a detach through, and changes
// nothing else.
func FuzzNodeListing(f *testing.F) {
	f.Add([]byte{0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 1}, byte(0))
	f.Add([]byte{0, 0, 0, 1, 1, 0, 1, 1, 0, 0, 0, 0, 4, 1, 1}, byte(7))
	f.Add([]byte{0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 3, 0, 1}, byte(1))
	f.Fuzz(func(t *testing.T, data []byte, l byte) {
		base := fuzzInput(data)
		listing := &decide.NodeListing{InUse: l&1 != 0, Attached: l&2 != 0, Written: l&4 != 0}
		in := base
		in.Listing = listing
		p := decide.Decide(in)
		// ref is the same input with the correction done by hand: the
		// entry counts as not mounted when the node lists the volume
		// nowhere and it was never reported nor is wanted.
		ref := base
		listed := listing.InUse || listing.Attached || listing.Written
		if a := base.Actual; !listed && a != nil && !a.ReportedInNodeStatus && base.Wanted == nil {
			cp := *a
			cp.MountedByNode = false
			ref.Actual = &cp
		}
		if want := decide.Decide(ref); !reflect.DeepEqual(p, want) {
			t.Fatalf("listing %+v: got %v, want %v", *listing, p.Kind, want.Kind)
		}
		checkInvariants(t, ref, p)
		// The same input with the node status listing the volume: a
		// detach waits for the node status, with the same actual state
		// change; every other plan stays as it is.
		gatedIn := in
		gatedIn.NodeStatusMayList = true
		g := decide.Decide(gatedIn)
		switch {
		case p.Kind == decide.KindDetach:
			if g.Kind != decide.KindWaitForNodeStatus || g.Detach != nil || g.Events != nil || !g.WakeNodeStatus || !reflect.DeepEqual(g.Actual, p.Actual) {
				t.Fatalf("detach while listed %+v", g)
			}
		case !reflect.DeepEqual(g, p):
			t.Fatalf("the node status listing changed a %v plan into %v", p.Kind, g.Kind)
		}
	})
}
