package kubelet_test

import (
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/kube"
)

// The ordering contract between the attach/detach controller, the
// attacher and the kubelet, checked from the mock driver's call log (call
// start and end on one clock) and the recorded API history (resourceVersions
// order writes exactly). Every test of the package checks every attach it
// makes with checkAttach and every detach with checkDetach (a forced
// detach with checkForcedDetach), so the contract is asserted on every
// volume that leaves a node.

// attachFacts are the attach's landmarks, for a test's own checks.
type attachFacts struct {
	publish, stage, nodePublish csimock.Call
	attached, running           change
}

// checkAttach asserts, for vol on n and the Pod pod running it:
// ControllerPublish ends before the kubelet's first NodeStage of the
// volume on that node starts (no stage is even tried before), NodeStage
// ends before NodePublish starts, and the Pod is Running only after the
// VolumeAttachment was attached (by RV).
func (r *rig) checkAttach(vol string, n *node, pod string) attachFacts {
	t := r.t
	t.Helper()
	calls := r.s.Driver.Calls()
	var f attachFacts
	var ok bool
	if f.publish, ok = findNodeCall(calls, "ControllerPublishVolume", vol, n.id, codes.OK); !ok {
		t.Fatalf("no ControllerPublish of %s to %s; calls:\n%s", vol, n.id, callTable(calls))
	}
	for _, c := range volumeCalls(calls, vol, n.id) {
		if isNodeMethod(c.Method) && c.Start.Before(f.publish.End) {
			t.Errorf("%s of %s on %s (#%d at %s) before ControllerPublish ended (%s)", c.Method, vol, n.id, c.ID, stamp(c.Start), stamp(f.publish.End))
		}
	}
	if f.stage, ok = findNodeCall(calls, "NodeStageVolume", vol, n.id, codes.OK); !ok {
		t.Fatalf("no NodeStage of %s on %s; calls:\n%s", vol, n.id, callTable(calls))
	}
	if f.nodePublish, ok = findNodeCall(calls, "NodePublishVolume", vol, n.id, codes.OK); !ok {
		t.Fatalf("no NodePublish of %s on %s; calls:\n%s", vol, n.id, callTable(calls))
	}
	if f.stage.Endpoint != n.id || f.nodePublish.Endpoint != n.id {
		t.Errorf("node calls of %s not on %s's endpoint: stage on %q, publish on %q", vol, n.id, f.stage.Endpoint, f.nodePublish.Endpoint)
	}
	if !f.stage.End.Before(f.nodePublish.Start) {
		t.Errorf("want NodeStage → NodePublish of %s on %s, got\n%s", vol, n.id, callTable(calls))
	}
	va := r.vaName(vol, n)
	f.attached = r.hist.mustFirst(t, "VolumeAttachment "+va+" attached", vaNamed(va, func(va *storagev1.VolumeAttachment) bool { return va.Status.Attached }))
	if pod != "" {
		f.running = r.hist.mustFirst(t, "Pod "+pod+" Running", podNamed(pod, func(p *v1.Pod) bool { return p.Status.Phase == v1.PodRunning }))
		if f.running.RV < f.attached.RV {
			t.Errorf("Pod %s Running (%s) before VolumeAttachment %s was attached (%s)", pod, f.running, va, f.attached)
		}
	}
	return f
}

// detachFacts are the detach's landmarks.
type detachFacts struct {
	unpublish, unstage, ctrlUnpublish csimock.Call
	lastInUse, deleting, gone         change
}

// checkDetach asserts, for vol leaving n after an unmount: the kubelet's
// NodeUnpublish ends before its NodeUnstage starts (each required when
// the kubelet ever tried the matching NodePublish/NodeStage); no Node
// call of the volume on that node is in flight or starts once
// ControllerUnpublish starts; the VolumeAttachment's deletion comes after
// the last Node status that listed the volume in volumesInUse (by RV);
// ControllerUnpublish starts after the deletion and after NodeUnstage
// ended; the VolumeAttachment disappears after ControllerUnpublish ended;
// and the node holds the volume neither staged nor published.
func (r *rig) checkDetach(vol string, n *node) detachFacts {
	t := r.t
	t.Helper()
	calls := r.s.Driver.Calls()
	var f detachFacts
	var ok bool
	if f.ctrlUnpublish, ok = findNodeCall(calls, "ControllerUnpublishVolume", vol, n.id, codes.OK); !ok {
		t.Fatalf("no ControllerUnpublish of %s from %s; calls:\n%s", vol, n.id, callTable(calls))
	}
	mine := volumeCalls(calls, vol, n.id)
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
		if f.unpublish, ok = lastOK("NodeUnpublishVolume"); !ok {
			t.Errorf("%s was NodePublished on %s but never NodeUnpublished before its detach:\n%s", vol, n.id, callTable(mine))
		}
	}
	if tried("NodeStageVolume") {
		if f.unstage, ok = lastOK("NodeUnstageVolume"); !ok {
			t.Errorf("%s was NodeStaged on %s but never NodeUnstaged before its detach:\n%s", vol, n.id, callTable(mine))
		}
	}
	if !f.unpublish.End.IsZero() && !f.unstage.End.IsZero() && !f.unpublish.End.Before(f.unstage.Start) {
		t.Errorf("NodeUnstage of %s on %s started before NodeUnpublish ended:\n%s", vol, n.id, callTable(mine))
	}
	for _, c := range mine {
		if isNodeMethod(c.Method) && (!c.Done() || !c.End.Before(f.ctrlUnpublish.Start)) {
			t.Errorf("%s of %s on %s (#%d, %s–%s) in flight when ControllerUnpublish started (%s)", c.Method, vol, n.id, c.ID, stamp(c.Start), stamp(c.End), stamp(f.ctrlUnpublish.Start))
		}
	}
	if !f.unstage.End.IsZero() && !f.unstage.End.Before(f.ctrlUnpublish.Start) {
		t.Errorf("ControllerUnpublish of %s from %s (%s) before NodeUnstage ended (%s)", vol, n.id, stamp(f.ctrlUnpublish.Start), stamp(f.unstage.End))
	}

	va := r.vaName(vol, n)
	unique := kube.UniqueVolumeName(testDriver, vol)
	f.deleting = r.hist.mustFirst(t, "VolumeAttachment "+va+" deleted", vaNamed(va, func(va *storagev1.VolumeAttachment) bool { return va.DeletionTimestamp != nil }))
	if last, ok := r.hist.last(nodeNamed(n.Name, func(no *v1.Node) bool { return inUse(no, unique) })); ok {
		f.lastInUse = last
		if f.deleting.RV < last.RV {
			t.Errorf("VolumeAttachment %s deleted (%s) while Node %s still listed %s in volumesInUse (%s)", va, f.deleting, n.Name, vol, last)
		}
		if dropped, ok := r.hist.first(after(last.RV, nodeNamed(n.Name, func(no *v1.Node) bool { return !inUse(no, unique) }))); ok &&
			!f.unstage.End.IsZero() && !dropped.Observed.After(f.unstage.End) {
			t.Errorf("%s left Node %s's volumesInUse (%s) before NodeUnstage ended (%s)", vol, n.Name, dropped, stamp(f.unstage.End))
		}
	}
	obj := f.deleting.Obj.(*storagev1.VolumeAttachment)
	if f.ctrlUnpublish.Start.Before(obj.DeletionTimestamp.Time) {
		t.Errorf("ControllerUnpublish of %s from %s (%s) before the VolumeAttachment's deletion (%s)", vol, n.id, stamp(f.ctrlUnpublish.Start), obj.DeletionTimestamp.Format(time.TimeOnly))
	}
	if len(obj.Finalizers) == 0 {
		t.Errorf("the deleted VolumeAttachment %s carried no finalizer: nothing held it until ControllerUnpublish", va)
	}
	f.gone = r.hist.mustFirst(t, "VolumeAttachment "+va+" removed", func(c change) bool {
		return c.Type == watch.Deleted && vaNamed(va, func(*storagev1.VolumeAttachment) bool { return true })(c)
	})
	if !f.gone.Observed.After(f.ctrlUnpublish.End) {
		t.Errorf("VolumeAttachment %s removed (%s) before ControllerUnpublish ended (%s)", va, f.gone, stamp(f.ctrlUnpublish.End))
	}
	nv := r.s.Driver.NodeVolumes(n.id)
	if _, staged := nv.Staged[vol]; staged || len(nv.Published[vol]) > 0 {
		t.Errorf("node %s still holds %s after its detach: %+v", n.id, vol, nv)
	}
	return f
}
