package decide_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/latchcsi/latch/internal/attachdetach/decide"
	"github.com/latchcsi/latch/internal/attachdetach/nodestatus"
	"github.com/latchcsi/latch/internal/attachdetach/state"
	"github.com/latchcsi/latch/internal/attachdetach/volume"
)

// story is a minimal stand-in for the API server and the controller's
// I/O: it applies plans to the real state caches (the actual state's node
// lists included, which give Decide its NodeStatusMayList as they do in
// the controller) and records the ordered API writes and events, so
// multi-step stories can be told with the real Decide. Every rule of a
// pass is Decide's; the story only carries the plan out. csi-attacher is
// played by the test (attach, finishDetach).
type story struct {
	t      *testing.T
	dsw    *state.Desired
	asw    *state.Actual
	nodes  map[string]decide.NodeFacts
	vas    map[string]*decide.VAFacts
	status map[string][]v1.AttachedVolume // node.status.volumesAttached
	writes []string
	events []string
	now    time.Time
}

func newStory(t *testing.T, nodes ...string) *story {
	w := &story{t: t, dsw: state.NewDesired(), asw: state.NewActual(), nodes: map[string]decide.NodeFacts{},
		vas: map[string]*decide.VAFacts{}, status: map[string][]v1.AttachedVolume{}, now: t0}
	for _, n := range nodes {
		w.nodes[n] = ready
		w.dsw.AddNode(n, true)
		w.asw.SetVolumesInUse(n, nil)
	}
	return w
}

func (w *story) addPod(p state.PodRef, node string, v volume.Attachable) {
	if _, ok := w.dsw.AddPod(p, node, []volume.Attachable{v}); !ok {
		w.t.Fatalf("pod %s not added", p.Name)
	}
}

// sync runs every key of vol until no plan changes anything any more,
// like a work queue that re-enqueues the volume's keys on every change.
func (w *story) sync(vol v1.UniqueVolumeName) {
	for range 20 {
		changed := false
		for _, k := range w.keys(vol) {
			changed = w.step(k) || changed
		}
		if !changed {
			return
		}
	}
	w.t.Fatal("no fixpoint after 20 rounds")
}

func (w *story) keys(vol v1.UniqueVolumeName) []state.Key {
	nodes := w.dsw.NodesWantingVolume(vol)
	for _, e := range w.asw.ForVolume(vol) {
		nodes = append(nodes, e.Node)
	}
	for name := range w.vas {
		for n := range w.nodes {
			if name == rwo.AttachmentName(n) {
				nodes = append(nodes, n)
			}
		}
	}
	slices.Sort(nodes)
	var out []state.Key
	for _, n := range slices.Compact(nodes) {
		out = append(out, state.Key{Volume: vol, Node: n})
	}
	return out
}

func (w *story) step(k state.Key) bool {
	in := decide.Gather(k, w.dsw, w.asw)
	in.Node = w.nodes[k.Node]
	name, _ := volume.AttachmentNameFor(k.Volume, k.Node)
	if va := w.vas[name]; va != nil {
		in.VA = *va
	}
	in.Config = decide.DefaultConfig()
	in.Now = w.now
	in.NodeStatusMayList = w.asw.NodeStatusMayList(k.Node, k.Volume, w.status[k.Node])
	p := decide.Decide(in)
	changed := false
	if p.Actual != nil {
		changed = w.asw.Apply(k, *p.Actual)
	}
	switch p.Kind {
	case decide.KindCreate:
		if w.vas[p.Create.Name] == nil {
			w.vas[p.Create.Name] = &decide.VAFacts{Exists: true}
			w.writes = append(w.writes, "create VA on "+p.Create.Spec.NodeName)
			changed = true
		}
	case decide.KindDetach:
		if va := w.vas[p.Detach.Name]; va != nil && !va.Deleting {
			va.Deleting = true
			w.writes = append(w.writes, fmt.Sprintf("delete VA on %s (%s)", k.Node, p.Detach.Reason))
			changed = true
		}
	}
	for _, e := range p.Events {
		if w.dsw.MarkReported(e.Pod.UID, e.DedupeKey) {
			w.events = append(w.events, e.Pod.Name+": "+e.Message)
		}
	}
	// The node status updater runs after every pass, batched per node;
	// a write wakes the keys waiting for it.
	for n := range w.nodes {
		changed = w.writeNodeStatus(n) || changed
	}
	return changed
}

func (w *story) writeNodeStatus(node string) bool {
	cur := &v1.Node{Status: v1.NodeStatus{VolumesAttached: w.status[node]}}
	want, needed := nodestatus.ForNode(cur, w.asw.BeginNodeStatusWrite(node))
	if needed {
		w.status[node] = want
		w.writes = append(w.writes, fmt.Sprintf("node %s volumesAttached=%d", node, len(want)))
	}
	w.asw.FinishNodeStatusWrite(node, w.status[node], true, "")
	return needed
}

func (w *story) attach(node string) { w.vas[rwo.AttachmentName(node)].Attached = true }

func (w *story) finishDetach(node string) { delete(w.vas, rwo.AttachmentName(node)) }

func (w *story) expectWrites(want ...string) {
	w.t.Helper()
	if !slices.Equal(w.writes, want) {
		w.t.Errorf("API writes:\n  got  %s\n  want %s", strings.Join(w.writes, "; "), strings.Join(want, "; "))
	}
	w.writes = nil
}

// attachedAndMounted plays pod p getting volume v on node: the create, the
// attacher's attach, the node status write and the event, then the
// kubelet's mount. Writes and events are checked on the way.
func (w *story) attachedAndMounted(p state.PodRef, node string, v volume.Attachable) {
	w.t.Helper()
	w.addPod(p, node, v)
	w.sync(v.UniqueName)
	w.expectWrites("create VA on " + node)
	w.attach(node)
	w.sync(v.UniqueName)
	w.expectWrites("node " + node + " volumesAttached=1")
	w.expectEvents(p.Name + `: AttachVolume.Attach succeeded for volume "` + v.SpecName + `" `)
	w.asw.SetVolumesInUse(node, []v1.UniqueVolumeName{v.UniqueName})
}

// movesOnceUnmounted plays from's kubelet unmounting vol, whose last Pod
// there is gone: the volume leaves from's node status, its
// VolumeAttachment is deleted, csi-attacher finishes the detach, and the
// VolumeAttachment on to (which waited) is created.
func (w *story) movesOnceUnmounted(vol v1.UniqueVolumeName, from, to string) {
	w.t.Helper()
	w.asw.SetVolumesInUse(from, nil)
	w.sync(vol)
	w.expectWrites("node "+from+" volumesAttached=0", "delete VA on "+from+" (unmounted)")
	w.finishDetach(from)
	w.sync(vol)
	w.expectWrites("create VA on " + to)
}

func (w *story) expectEvents(want ...string) {
	w.t.Helper()
	if !slices.Equal(w.events, want) {
		w.t.Errorf("events:\n  got  %q\n  want %q", w.events, want)
	}
	w.events = nil
}

func TestScenarioRWOConflictThenRelease(t *testing.T) {
	w := newStory(t, nodeA, nodeB)
	vol := rwo.UniqueName
	w.attachedAndMounted(podA, nodeA, rwo)

	// A second pod on node B: conflict, reported once however often it runs.
	w.addPod(podB, nodeB, rwo)
	w.sync(vol)
	w.sync(vol)
	w.expectWrites()
	w.expectEvents(`web-1: Multi-Attach error for volume "pv1" Volume is already used by pod(s) web-0`)

	// Pod A goes away; node A still uses the volume: nothing moves.
	w.dsw.DeletePod(podA.UID)
	w.sync(vol)
	w.expectWrites()
	w.expectEvents()

	// Node A unmounts: volume leaves A's node status, then its VA is
	// deleted; csi-attacher finishes the detach; B attaches.
	w.movesOnceUnmounted(vol, nodeA, nodeB)
	w.attach(nodeB)
	w.sync(vol)
	w.expectWrites("node node-b volumesAttached=1")
	w.expectEvents(`web-1: AttachVolume.Attach succeeded for volume "pv1" `)
	if got := w.asw.ForVolume(vol); len(got) != 1 || got[0].Node != nodeB || got[0].State != state.StateAttached {
		t.Errorf("ASW = %+v", got)
	}
}

func TestScenarioNotReadyNodeForcedDetachAfterTimeout(t *testing.T) {
	w := newStory(t, nodeA)
	vol := rwo.UniqueName
	w.addPod(podA, nodeA, rwo)
	w.sync(vol)
	w.attach(nodeA)
	w.sync(vol)
	w.asw.SetVolumesInUse(nodeA, []v1.UniqueVolumeName{vol})
	w.writes = nil
	w.events = nil

	// The node dies with the volume mounted; its pod is deleted.
	w.nodes[nodeA] = notReady
	w.dsw.DeletePod(podA.UID)
	in := decide.Gather(keyOn(nodeA), w.dsw, w.asw)
	in.Node, in.VA, in.Config, in.Now = notReady, *w.vas[vaName], decide.DefaultConfig(), w.now
	if p := decide.Decide(in); p.Kind != decide.KindWait || p.RequeueAfter != 6*time.Minute {
		t.Fatalf("first pass: %v after %v", p.Kind, p.RequeueAfter)
	}
	w.sync(vol)
	w.expectWrites()

	w.now = w.now.Add(6 * time.Minute) // the requeue timer fires
	w.sync(vol)
	w.expectWrites("node node-a volumesAttached=0", "delete VA on node-a (timeout)")
}
