package decide_test

import (
	"reflect"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/attachdetach/decide"
	"github.com/latchcsi/latch/internal/attachdetach/state"
	"github.com/latchcsi/latch/internal/attachdetach/volume"
)

// bits hands out fuzz input a few bits at a time; past the end it returns
// zeros, so every byte string is a valid input.
type bits struct {
	data []byte
	pos  int
}

func (b *bits) next(n int) int {
	if b.pos >= len(b.data) {
		return 0
	}
	v := int(b.data[b.pos]) % n
	b.pos++
	return v
}

func (b *bits) flag() bool { return b.next(2) == 1 }

var fuzzModes = [][]v1.PersistentVolumeAccessMode{
	{v1.ReadWriteOnce}, {v1.ReadWriteOncePod}, {v1.ReadWriteMany}, {v1.ReadOnlyMany}, nil,
}

func fuzzInput(data []byte) decide.Input {
	b := &bits{data: data}
	vol := testVolume(fuzzModes[b.next(len(fuzzModes))]...)
	in := decide.Input{
		Key:    keyOn(nodeA),
		Config: decide.Config{MaxWaitForUnmount: time.Duration(b.next(4)) * 3 * time.Minute, DisableForceDetachOnTimeout: b.flag()},
		Now:    t0,
		Node:   decide.NodeFacts{Exists: b.flag(), Managed: b.flag(), Ready: b.flag(), OutOfService: b.flag()},
		VA:     decide.VAFacts{Exists: b.flag(), Attached: b.flag(), Deleting: b.flag()},
	}
	if !in.VA.Exists {
		in.VA = decide.VAFacts{}
	}
	if b.flag() {
		in.VA.AttachError = &storagev1.VolumeError{Time: metav1.NewTime(t0), Message: "boom"}
	}
	pods := []state.PodRef{podA, podB, podX}
	if n := b.next(3); n > 0 {
		in.Wanted = wants(vol, pods[:n]...)
	}
	if st := state.AttachState(b.next(5)); st != 0 {
		v := vol
		in.Actual = &state.Attachment{Key: in.Key, Spec: &v, State: st, ReportedInNodeStatus: b.flag(), MountedByNode: b.flag()}
		if b.flag() {
			in.Actual.DetachRequestedAt = t0.Add(-time.Duration(b.next(10)) * time.Minute)
		}
		if b.flag() {
			in.Actual.Spec = nil
		}
	}
	for _, n := range []string{nodeB, "node-c"} {
		p := decide.Peer{Node: n, State: state.AttachState(b.next(5))}
		if b.flag() {
			p.Pods = []state.PodRef{podX}
		}
		if p.State != 0 || len(p.Pods) > 0 {
			in.Peers = append(in.Peers, p)
		}
	}
	// Per-node CSI migration (read last, so the seeds above keep their
	// meaning).
	if in.Wanted != nil && b.flag() {
		w := *in.Wanted
		w.Volume.MigratedFrom = gcePD
		in.Wanted = &w
	}
	if b.flag() {
		in.Config.MigrationByNode = map[string]bool{gcePD: true}
	}
	in.CSINode = decide.CSINodeFacts{Exists: b.flag()}
	if in.CSINode.Exists && b.flag() {
		in.CSINode.MigratedPlugins = "kubernetes.io/aws-ebs," + gcePD
	}
	// Other specs naming the same unique volume (alias PVs), and an
	// unknown create outcome (read last, so the seeds above keep their
	// meaning).
	aliasSpec := func() volume.Attachable {
		a := testVolume(fuzzModes[b.next(len(fuzzModes))]...)
		a.PVName, a.SpecName = "pv2", "pv2"
		return a
	}
	if in.Wanted != nil && b.flag() {
		w := *in.Wanted
		w.Specs = []volume.Attachable{w.Volume, aliasSpec()}
		in.Wanted = &w
	}
	if in.Actual != nil && in.Actual.Spec != nil && b.flag() {
		a := *in.Actual
		a.Spec = ptrTo(aliasSpec())
		in.Actual = &a
	}
	for i := range in.Peers {
		if b.flag() {
			in.Peers[i].Specs = []volume.Attachable{aliasSpec()}
		}
	}
	if !in.VA.Exists {
		in.VA.MayExist = b.flag()
	}
	// A node that came back with Pods still to record (read last too).
	in.Node.PodsPending = in.Node.Exists && b.flag()
	return in
}

// naiveExclusive is the multi-attach rule written the slow, obvious way:
// the volume is exclusive if any spec naming it anywhere has access modes
// and neither ReadWriteMany nor ReadOnlyMany among them.
func naiveExclusive(in decide.Input) bool {
	var all [][]v1.PersistentVolumeAccessMode
	if in.Wanted != nil {
		all = append(all, in.Wanted.Volume.AccessModes)
		for _, s := range in.Wanted.Specs {
			all = append(all, s.AccessModes)
		}
	}
	if in.Actual != nil && in.Actual.Spec != nil {
		all = append(all, in.Actual.Spec.AccessModes)
	}
	for _, p := range in.Peers {
		for _, s := range p.Specs {
			all = append(all, s.AccessModes)
		}
	}
	for _, modes := range all {
		shared := false
		for _, m := range modes {
			shared = shared || m == v1.ReadWriteMany || m == v1.ReadOnlyMany
		}
		if len(modes) > 0 && !shared {
			return true
		}
	}
	return false
}

// applied is what the ASW holds for the key after the executor applied
// plan.Actual, with observations unchanged (a new entry is assumed
// mounted, as state.Actual does).
func applied(in decide.Input, p decide.Plan) *state.Attachment {
	if p.Actual == nil {
		return in.Actual
	}
	if p.Actual.Remove {
		return nil
	}
	e := &state.Attachment{Key: in.Key, MountedByNode: true}
	if in.Actual != nil {
		cp := *in.Actual
		e = &cp
	}
	e.State, e.ReportedInNodeStatus, e.DetachRequestedAt = p.Actual.State, p.Actual.ReportedInNodeStatus, p.Actual.DetachRequestedAt
	if p.Actual.Spec != nil {
		e.Spec = p.Actual.Spec
	}
	return e
}

func checkInvariants(t *testing.T, in decide.Input, p decide.Plan) {
	t.Helper()
	wanted := in.Wanted != nil && len(in.Wanted.Pods) > 0 && in.Node.Exists
	mounted := in.Actual == nil || in.Actual.MountedByNode

	if p.Kind == decide.KindCreate {
		if in.VA.Exists || !in.Node.Managed || !wanted {
			t.Fatalf("create with VA=%+v node=%+v wanted=%v", in.VA, in.Node, wanted)
		}
		if naiveExclusive(in) {
			for _, pr := range in.Peers {
				if pr.State != 0 {
					t.Fatalf("create of an exclusive volume on %s while %s on %s", in.Key.Node, pr.State, pr.Node)
				}
			}
		}
		if in.VA.MayExist {
			t.Fatal("create again while the outcome of the last create is unknown")
		}
		if p.Actual == nil && (in.Actual == nil || in.Actual.State != state.StateAttaching) {
			t.Fatalf("create without recording attaching first: %+v", in.Actual)
		}
	}
	if plugin := migratedFrom(in); plugin != "" && in.Config.MigrationByNode[plugin] && !in.CSINode.Migrated(plugin) {
		if p.Kind == decide.KindCreate {
			t.Fatalf("create of a %s volume on a node that has not migrated it: %+v", plugin, in.CSINode)
		}
	}
	if p.Kind == decide.KindNodeNotMigrated {
		if in.VA.Exists || !wanted {
			t.Fatalf("not-migrated wait with VA=%+v wanted=%v", in.VA, wanted)
		}
		if p.Actual != nil && (in.Actual == nil || p.Actual.State != in.Actual.State || p.Actual.ReportedInNodeStatus != in.Actual.ReportedInNodeStatus) {
			t.Fatalf("not-migrated wait changes the attachment: %+v → %+v", in.Actual, p.Actual)
		}
	}
	if p.Actual != nil && p.Actual.Remove && in.VA.MayExist {
		t.Fatalf("%v forgets an attachment whose VolumeAttachment may exist", p.Kind)
	}
	if p.Kind == decide.KindDetach || (p.Actual != nil && p.Actual.Remove) {
		if wanted {
			t.Fatalf("%v of a volume wanted on an existing node", p.Kind)
		}
	}
	if p.Kind == decide.KindDetach {
		if !in.VA.Exists || in.VA.Deleting {
			t.Fatalf("detach with VA %+v", in.VA)
		}
		if in.Node.PodsPending {
			t.Fatalf("detach on a node that came back before its Pods are recorded again: %+v", in.Node)
		}
		if mounted {
			switch p.Detach.Reason {
			case decide.DetachOutOfService:
				if !in.Node.Exists || !in.Node.OutOfService {
					t.Fatalf("out-of-service detach without the taint: %+v", in.Node)
				}
			case decide.DetachForcedTimeout:
				at := in.Now
				if in.Actual != nil && !in.Actual.DetachRequestedAt.IsZero() {
					at = in.Actual.DetachRequestedAt
				}
				if in.Node.Exists && in.Node.Ready || in.Config.DisableForceDetachOnTimeout || in.Now.Sub(at) < in.Config.MaxWaitForUnmount {
					t.Fatalf("timeout detach too early: node %+v cfg %+v requested %v", in.Node, in.Config, at)
				}
			default:
				t.Fatalf("detach of a mounted volume with reason %q", p.Detach.Reason)
			}
		}
		if in.Actual != nil && in.Actual.ReportedInNodeStatus || in.NodeStatusMayList {
			t.Fatalf("detach while the node status may list the volume: entry %+v, listed %v", in.Actual, in.NodeStatusMayList)
		}
		if p.Actual == nil && in.Actual.ReportedInNodeStatus {
			t.Fatal("detach keeps the volume in node status")
		}
	}
	wasReported := in.Actual != nil && in.Actual.ReportedInNodeStatus
	if p.Actual != nil && !p.Actual.Remove && p.Actual.ReportedInNodeStatus && !wasReported && !(in.VA.Exists && in.VA.Attached) {
		t.Fatalf("put into node status without an attached VA: VA %+v", in.VA)
	}
	if p.RequeueAfter < 0 {
		t.Fatalf("negative requeue %v", p.RequeueAfter)
	}
}

func migratedFrom(in decide.Input) string {
	if in.Wanted == nil {
		return ""
	}
	return in.Wanted.Volume.MigratedFrom
}

func FuzzDecide(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0, 0, 0, 1, 1, 1, 0, 1, 1, 0, 0, 1, 3, 1, 1, 0, 3, 1, 1, 1})
	f.Add([]byte{0, 2, 0, 1, 1, 0, 0, 1, 1, 0, 0, 0, 0, 3, 0, 1, 0, 0, 3, 0})
	f.Add([]byte{0, 1, 1, 1, 1, 0, 1, 1, 1, 0, 0, 2, 3, 1, 1, 1, 5, 0, 2, 1})
	f.Add([]byte{4, 3, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0})
	// Migrated volumes with the per-node gate on, with and without a
	// CSINode listing the plugin.
	f.Add([]byte{0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1})
	f.Add([]byte{0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0})
	f.Add([]byte{0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0})
	// An RWX volume wanted here while an RWO alias is attached on node B;
	// and a Pod gone while our create's outcome is unknown.
	f.Add([]byte{2, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 1, 0, 3, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0})
	f.Add([]byte{0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		in := fuzzInput(data)
		before := deepCopyInput(in)
		p := decide.Decide(in)
		if !reflect.DeepEqual(in, before) {
			t.Fatal("Decide mutated its input")
		}
		if again := decide.Decide(in); !reflect.DeepEqual(p, again) {
			t.Fatal("Decide is not deterministic")
		}
		if p.Key != in.Key || p.Why == "" {
			t.Fatalf("plan key %v why %q", p.Key, p.Why)
		}
		checkInvariants(t, in, p)

		// Level-based: once the ASW update is applied and nothing else
		// changes, the next pass wants no further ASW change.
		next := in
		next.Actual = applied(in, p)
		p2 := decide.Decide(next)
		checkInvariants(t, next, p2)
		if p2.Actual != nil {
			t.Fatalf("no ASW fixpoint: %v %+v then %v %+v", p.Kind, p.Actual, p2.Kind, p2.Actual)
		}
	})
}

func deepCopyInput(in decide.Input) decide.Input {
	out := in
	if in.Wanted != nil {
		w := *in.Wanted
		w.Pods = append([]state.PodRef(nil), w.Pods...)
		out.Wanted = &w
	}
	if in.Actual != nil {
		a := *in.Actual
		if a.Spec != nil {
			s := *a.Spec
			a.Spec = &s
		}
		out.Actual = &a
	}
	if in.Wanted != nil {
		out.Wanted.Specs = append([]volume.Attachable(nil), in.Wanted.Specs...)
	}
	out.Peers = nil
	for _, p := range in.Peers {
		p.Pods = append([]state.PodRef(nil), p.Pods...)
		p.Specs = append([]volume.Attachable(nil), p.Specs...)
		out.Peers = append(out.Peers, p)
	}
	if in.VA.AttachError != nil {
		e := *in.VA.AttachError
		out.VA.AttachError = &e
	}
	return out
}
