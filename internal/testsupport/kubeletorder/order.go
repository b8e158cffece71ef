// Package kubeletorder checks the ordering contract between the
// attach/detach controller, the attacher and the real kubelet, from the
// mock driver's call log (call start and end on one clock) and a recorded
// API history of Nodes, VolumeAttachments and Pods (resourceVersions order
// writes exactly). The end-to-end suites that run hollow kubelets check
// every attach they make with CheckAttach and every detach with
// CheckDetach, so the contract is asserted on every volume that leaves a
// node.
package kubeletorder

import (
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// Checker reads one world: the mock driver serving the driver DriverName
// (controller side and every node endpoint) and the History recorded
// since before the world's first Pod.
type Checker struct {
	Driver     *csimock.Driver
	DriverName string
	History    *History
}

// AttachFacts are the attach's landmarks, for a test's own checks.
type AttachFacts struct {
	Publish, Stage, NodePublish csimock.Call
	Attached, Running           Change
}

// CheckAttach asserts, for vol on Node node (CSI node ID nodeID) and the
// Pod pod running it (none: ""): ControllerPublish ends before the
// kubelet's first NodeStage of the volume on that node starts (no stage
// is even tried before), NodeStage ends before NodePublish starts, and
// the Pod is Running only after the VolumeAttachment was attached (by
// RV).
func (k *Checker) CheckAttach(t testing.TB, vol, node, nodeID, pod string) AttachFacts {
	t.Helper()
	calls := k.Driver.Calls()
	var f AttachFacts
	var ok bool
	if f.Publish, ok = FindNodeCall(calls, "ControllerPublishVolume", vol, nodeID, codes.OK); !ok {
		t.Fatalf("no ControllerPublish of %s to %s; calls:\n%s", vol, nodeID, CallTable(calls))
	}
	for _, c := range VolumeCalls(calls, vol, nodeID) {
		if IsNodeMethod(c.Method) && c.Start.Before(f.Publish.End) {
			t.Errorf("%s of %s on %s (#%d at %s) before ControllerPublish ended (%s)", c.Method, vol, nodeID, c.ID, Stamp(c.Start), Stamp(f.Publish.End))
		}
	}
	if f.Stage, ok = FindNodeCall(calls, "NodeStageVolume", vol, nodeID, codes.OK); !ok {
		t.Fatalf("no NodeStage of %s on %s; calls:\n%s", vol, nodeID, CallTable(calls))
	}
	if f.NodePublish, ok = FindNodeCall(calls, "NodePublishVolume", vol, nodeID, codes.OK); !ok {
		t.Fatalf("no NodePublish of %s on %s; calls:\n%s", vol, nodeID, CallTable(calls))
	}
	if f.Stage.Endpoint != nodeID || f.NodePublish.Endpoint != nodeID {
		t.Errorf("node calls of %s not on %s's endpoint: stage on %q, publish on %q", vol, nodeID, f.Stage.Endpoint, f.NodePublish.Endpoint)
	}
	if !f.Stage.End.Before(f.NodePublish.Start) {
		t.Errorf("want NodeStage → NodePublish of %s on %s, got\n%s", vol, nodeID, CallTable(calls))
	}
	va := kubenames.VolumeAttachmentName(vol, k.DriverName, node)
	f.Attached = k.History.MustFirst(t, "VolumeAttachment "+va+" attached", VANamed(va, func(va *storagev1.VolumeAttachment) bool { return va.Status.Attached }))
	if pod != "" {
		f.Running = k.History.MustFirst(t, "Pod "+pod+" Running", PodNamed(pod, func(p *v1.Pod) bool { return p.Status.Phase == v1.PodRunning }))
		if f.Running.RV < f.Attached.RV {
			t.Errorf("Pod %s Running (%s) before VolumeAttachment %s was attached (%s)", pod, f.Running, va, f.Attached)
		}
	}
	return f
}

// DetachFacts are the detach's landmarks.
type DetachFacts struct {
	Unpublish, Unstage, CtrlUnpublish csimock.Call
	LastInUse, Deleting, Gone         Change
}

// CheckDetach asserts, for vol leaving Node node (CSI node ID nodeID)
// after an unmount: the kubelet's NodeUnpublish ends before its
// NodeUnstage starts (each required when the kubelet ever tried the
// matching NodePublish/NodeStage); no Node call of the volume on that
// node is in flight or starts once ControllerUnpublish starts; the
// VolumeAttachment is deleted while the Node's status (the last before
// the deletion, by RV) does not list the volume in volumesInUse, and the
// volume leaves volumesInUse only after NodeUnstage ended; a Node status
// that lists the volume again after the deletion (a kubelet tearing down
// a Pod it took up late) is followed by no NodeStage or NodePublish of
// it; ControllerUnpublish starts
// after the deletion and after NodeUnstage ended; the VolumeAttachment
// disappears after a ControllerUnpublish ended OK; and the node holds the
// volume neither staged nor published.
func (k *Checker) CheckDetach(t testing.TB, vol, node, nodeID string) DetachFacts {
	t.Helper()
	calls := k.Driver.Calls()
	f := DetachFacts{CtrlUnpublish: mustCtrlUnpublish(t, calls, vol, nodeID)}
	var ok bool
	mine := VolumeCalls(calls, vol, nodeID)
	tried := func(m string) bool {
		return slices.ContainsFunc(mine, func(c csimock.Call) bool { return c.Method == m })
	}
	lastOK := func(m string) (csimock.Call, bool) {
		for i := len(mine) - 1; i >= 0; i-- {
			if c := mine[i]; c.Method == m && c.Done() && c.Code == codes.OK {
				return c, true
			}
		}
		return csimock.Call{}, false
	}
	if tried("NodePublishVolume") {
		if f.Unpublish, ok = lastOK("NodeUnpublishVolume"); !ok {
			t.Errorf("%s was NodePublished on %s but never NodeUnpublished before its detach:\n%s", vol, nodeID, CallTable(mine))
		}
	}
	if tried("NodeStageVolume") {
		if f.Unstage, ok = lastOK("NodeUnstageVolume"); !ok {
			t.Errorf("%s was NodeStaged on %s but never NodeUnstaged before its detach:\n%s", vol, nodeID, CallTable(mine))
		}
	}
	if !f.Unpublish.End.IsZero() && !f.Unstage.End.IsZero() && !f.Unpublish.End.Before(f.Unstage.Start) {
		t.Errorf("NodeUnstage of %s on %s started before NodeUnpublish ended:\n%s", vol, nodeID, CallTable(mine))
	}
	noNodeCallDuring(t, mine, f.CtrlUnpublish, vol, nodeID)
	if !f.Unstage.End.IsZero() && !f.Unstage.End.Before(f.CtrlUnpublish.Start) {
		t.Errorf("ControllerUnpublish of %s from %s (%s) before NodeUnstage ended (%s)", vol, nodeID, Stamp(f.CtrlUnpublish.Start), Stamp(f.Unstage.End))
	}

	va := kubenames.VolumeAttachmentName(vol, k.DriverName, node)
	unique := kubenames.UniqueVolumeName(k.DriverName, vol)
	f.Deleting = k.History.MustFirst(t, "VolumeAttachment "+va+" deleted", VANamed(va, func(va *storagev1.VolumeAttachment) bool { return va.DeletionTimestamp != nil }))
	beforeDeletion := func(match func(Change) bool) func(Change) bool {
		return func(c Change) bool { return c.RV < f.Deleting.RV && match(c) }
	}
	// The Node status the deletion was decided on (the last one before
	// it) must not list the volume in volumesInUse while it lists it in
	// volumesAttached: the kubelet may mount it then. A listing in
	// volumesInUse alone can come a moment before the deletion, written
	// by a kubelet that took up a Pod after the controller took the
	// volume off volumesAttached (or before it was ever listed there),
	// too late for the controller to have seen it; that kubelet cannot
	// mount it (it stages and publishes only a volume volumesAttached
	// lists), and no NodeStage or NodePublish may start after it.
	if cur, ok := k.History.Last(beforeDeletion(NodeNamed(node, func(*v1.Node) bool { return true }))); ok && InUse(cur.Obj.(*v1.Node), unique) {
		if Attached(cur.Obj.(*v1.Node), unique) {
			t.Errorf("VolumeAttachment %s deleted (%s) while Node %s still listed %s in volumesInUse and volumesAttached (%s)", va, f.Deleting, node, vol, cur)
		}
		for _, c := range mine {
			if (c.Method == "NodeStageVolume" || c.Method == "NodePublishVolume") && c.Start.After(cur.Observed) {
				t.Errorf("%s of %s on %s (#%d at %s) after Node %s listed it in volumesInUse but not in volumesAttached (%s), just before the VolumeAttachment's deletion (%s)",
					c.Method, vol, nodeID, c.ID, Stamp(c.Start), node, cur, f.Deleting)
			}
		}
	}
	if last, ok := k.History.Last(beforeDeletion(NodeNamed(node, func(no *v1.Node) bool { return InUse(no, unique) }))); ok {
		f.LastInUse = last
		if dropped, ok := k.History.First(After(last.RV, NodeNamed(node, func(no *v1.Node) bool { return !InUse(no, unique) }))); ok &&
			!f.Unstage.End.IsZero() && !dropped.Observed.After(f.Unstage.End) {
			t.Errorf("%s left Node %s's volumesInUse (%s) before NodeUnstage ended (%s)", vol, node, dropped, Stamp(f.Unstage.End))
		}
	}
	// A Node status after the deletion may list the volume again: a
	// kubelet that took up a Pod deleted before its next status update
	// lists the Pod's volumes while it tears the Pod down. It must not
	// mount it: the kubelet stages or publishes only a volume it listed
	// and finds in volumesAttached, which the controller cleared first.
	if again, ok := k.History.First(After(f.Deleting.RV, NodeNamed(node, func(no *v1.Node) bool { return InUse(no, unique) }))); ok {
		for _, c := range mine {
			if (c.Method == "NodeStageVolume" || c.Method == "NodePublishVolume") && c.Start.After(f.Deleting.Observed) {
				t.Errorf("%s of %s on %s (#%d at %s) after the VolumeAttachment's deletion (%s); Node %s listed it again in volumesInUse (%s)",
					c.Method, vol, nodeID, c.ID, Stamp(c.Start), f.Deleting, node, again)
			}
		}
	}
	k.checkRemoval(t, &f, vol, va, nodeID)
	nv := k.Driver.NodeVolumes(nodeID)
	if _, staged := nv.Staged[vol]; staged || len(nv.Published[vol]) > 0 {
		t.Errorf("node %s still holds %s after its detach: %+v", nodeID, vol, nv)
	}
	return f
}

// CheckForcedDetach asserts, for vol detached from Node node (CSI node
// ID nodeID) without an unmount (the node's kubelet is gone): no Node
// call of the volume on that node is in flight or starts once
// ControllerUnpublish starts; ControllerUnpublish starts after the
// VolumeAttachment's deletion, which a finalizer held; and the
// VolumeAttachment disappears after a ControllerUnpublish ended OK. The
// facts' Unpublish and Unstage stay zero.
func (k *Checker) CheckForcedDetach(t testing.TB, vol, node, nodeID string) DetachFacts {
	t.Helper()
	calls := k.Driver.Calls()
	f := DetachFacts{CtrlUnpublish: mustCtrlUnpublish(t, calls, vol, nodeID)}
	noNodeCallDuring(t, VolumeCalls(calls, vol, nodeID), f.CtrlUnpublish, vol, nodeID)
	va := kubenames.VolumeAttachmentName(vol, k.DriverName, node)
	f.Deleting = k.History.MustFirst(t, "VolumeAttachment "+va+" deleted", VANamed(va, func(va *storagev1.VolumeAttachment) bool { return va.DeletionTimestamp != nil }))
	k.checkRemoval(t, &f, vol, va, nodeID)
	return f
}

// noNodeCallDuring fails for each Node call of mine (vol's calls on
// nodeID) in flight or started once ctrlUnpublish started.
func noNodeCallDuring(t testing.TB, mine []csimock.Call, ctrlUnpublish csimock.Call, vol, nodeID string) {
	t.Helper()
	for _, c := range mine {
		if IsNodeMethod(c.Method) && (!c.Done() || !c.End.Before(ctrlUnpublish.Start)) {
			t.Errorf("%s of %s on %s (#%d, %s–%s) in flight when ControllerUnpublish started (%s)", c.Method, vol, nodeID, c.ID, Stamp(c.Start), Stamp(c.End), Stamp(ctrlUnpublish.Start))
		}
	}
}

// checkRemoval asserts, for VolumeAttachment va whose deletion is
// f.Deleting: a finalizer held it, ControllerUnpublish (f.CtrlUnpublish)
// started after the deletion, and the object was removed (f.Gone, which
// it sets) only after a ControllerUnpublish of the volume from the node
// ended OK (the first to end: not necessarily f.CtrlUnpublish, the first
// to start, when a killed csi-attacher's call ended late).
func (k *Checker) checkRemoval(t testing.TB, f *DetachFacts, vol, va, nodeID string) {
	t.Helper()
	obj := f.Deleting.Obj.(*storagev1.VolumeAttachment)
	if f.CtrlUnpublish.Start.Before(obj.DeletionTimestamp.Time) {
		t.Errorf("ControllerUnpublish of %s from %s (%s) before the VolumeAttachment's deletion (%s)", vol, nodeID, Stamp(f.CtrlUnpublish.Start), obj.DeletionTimestamp.Format(time.TimeOnly))
	}
	if len(obj.Finalizers) == 0 {
		t.Errorf("the deleted VolumeAttachment %s carried no finalizer: nothing held it until ControllerUnpublish", va)
	}
	f.Gone = k.History.MustFirst(t, "VolumeAttachment "+va+" removed", func(c Change) bool {
		return c.Type == watch.Deleted && VANamed(va, func(*storagev1.VolumeAttachment) bool { return true })(c)
	})
	// The volume is unpublished once any ControllerUnpublish of it
	// succeeded: a csi-attacher killed mid-call leaves its call to end
	// late, after the new instance's own call and removal.
	done := f.CtrlUnpublish
	for _, c := range VolumeCalls(k.Driver.CallsTo("ControllerUnpublishVolume"), vol, nodeID) {
		if c.Done() && c.Code == codes.OK && c.End.Before(done.End) {
			done = c
		}
	}
	if !f.Gone.Observed.After(done.End) {
		t.Errorf("VolumeAttachment %s removed (%s) before any ControllerUnpublish ended (first at %s)", va, f.Gone, Stamp(done.End))
	}
}

// mustCtrlUnpublish is the first ControllerUnpublish of vol from nodeID
// that ended OK; the test fails without one.
func mustCtrlUnpublish(t testing.TB, calls []csimock.Call, vol, nodeID string) csimock.Call {
	t.Helper()
	c, ok := FindNodeCall(calls, "ControllerUnpublishVolume", vol, nodeID, codes.OK)
	if !ok {
		t.Fatalf("no ControllerUnpublish of %s from %s; calls:\n%s", vol, nodeID, CallTable(calls))
	}
	return c
}
