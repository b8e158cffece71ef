package reliability_test

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/latchcsi/latch/internal/attachdetach/controller"
	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/kube/kubenames"
	"github.com/latchcsi/latch/internal/stack"
	"github.com/latchcsi/latch/internal/testsupport/kubeletorder"
)

// TestRealKubelet_podDeletedBeforeItsKubeletSawIt_detachedUnmountedNeverMounted
// is the chaos run's "Pod deleted while Pending" made deterministic: the
// kubelet of the node is stopped, a Pod is created there (its volume is
// attached: the controller does not wait for a kubelet) and deleted; with
// the Pod terminating and never mounted, the controller detaches (the
// volume is in no volumesInUse). Then the kubelet starts, sees the
// terminating Pod, may list its volume in volumesInUse for a moment, and
// removes the Pod. The detach passes CheckDetach, the kubelet never
// stages or publishes the volume, and nothing is left.
func TestRealKubelet_podDeletedBeforeItsKubeletSawIt_detachedUnmountedNeverMounted(t *testing.T) {
	w := newKubeletWorld(t, controller.Config{}, 1)
	node := w.nodes[0]
	h := w.hollow[node]
	pv := w.volume("late")
	if err := h.StopKubelet(); err != nil {
		t.Fatal(err)
	}
	if err := w.pod("p", node, pv); err != nil {
		t.Fatal(err)
	}
	w.waitAttached(pv, node)
	w.deletePod("p")
	w.waitGone(pv, node)
	deleted, ok := w.hist.First(kubeletorder.VANamed(w.vaName(pv, node), func(va *storagev1.VolumeAttachment) bool { return va.DeletionTimestamp != nil }))
	if !ok {
		t.Fatalf("no recorded deletion of VolumeAttachment %s", w.vaName(pv, node))
	}
	if err := h.StartKubelet(w.ctx); err != nil {
		t.Fatal(err)
	}
	w.waitPodGone("p")
	for _, c := range kubeletorder.VolumeCalls(w.mock.Calls(), pv, stack.NodeID(node)) {
		if kubeletorder.IsNodeMethod(c.Method) && (c.Method == "NodeStageVolume" || c.Method == "NodePublishVolume") {
			t.Errorf("%s of %s on %s (#%d at %s) after its detach (VolumeAttachment deleted at RV %d)", c.Method, pv, node, c.ID, kubeletorder.Stamp(c.Start), deleted.RV)
		}
	}
	if c, ok := w.hist.First(kubeletorder.After(deleted.RV, kubeletorder.NodeNamed(node, func(n *v1.Node) bool {
		return kubeletorder.InUse(n, kubenames.UniqueVolumeName(w.driver, pv))
	}))); ok {
		t.Logf("the restarted kubelet listed %s in volumesInUse after its detach: %s", pv, c)
	}
	w.checkNothingLeft(time.Minute)
	if n := w.checkDetaches(); n != 1 {
		t.Errorf("%d detaches checked, want 1", n)
	}
}

// TestRealKubelet_podDeletedBeforeItsNodeStatusListsTheVolume_detachPassesTheOrderCheck:
// the real kubelet lists a volume in volumesInUse at its next node status
// update (every 2 s), and mounts only after that listing was written and
// the volume shows in volumesAttached. A Pod deleted after its kubelet took
// it up but before that update is detached at once (its volume is in no
// volumesInUse); the kubelet, still tearing the Pod down, may then list the
// volume for a moment, but never stages or publishes it (the controller
// took it out of volumesAttached before deleting the VolumeAttachment).
// The chaos run found this (seed 1795672800539770089: kubeletorder's
// CheckDetach reported "deleted while Node still listed ... in
// volumesInUse" for a listing written after the deletion). Each round
// deletes the Pod right after the kubelet reported it Pending, which
// usually falls before the next node status update; the test logs how
// many rounds saw the late listing.
func TestRealKubelet_podDeletedBeforeItsNodeStatusListsTheVolume_detachPassesTheOrderCheck(t *testing.T) {
	w := newKubeletWorld(t, controller.Config{}, 1)
	node := w.nodes[0]
	late := 0
	const rounds = 5
	for i := range rounds {
		pv := w.volume(fmt.Sprintf("r%d", i))
		pod := fmt.Sprintf("p%d", i)
		if err := w.pod(pod, node, pv); err != nil {
			t.Fatal(err)
		}
		w.waitAttached(pv, node)
		// The kubelet took the Pod up: it wrote its status.
		w.hist.MustFirst(t, "the kubelet's status of Pod "+pod, kubeletorder.PodNamed(pod, func(p *v1.Pod) bool { return len(p.Status.Conditions) > 0 }))
		w.deletePod(pod)
		w.waitGone(pv, node)
		w.waitPodGone(pod)
		deleted := w.hist.MustFirst(t, "VolumeAttachment of "+pv+" deleted", kubeletorder.VANamed(w.vaName(pv, node), func(va *storagev1.VolumeAttachment) bool { return va.DeletionTimestamp != nil }))
		if _, ok := w.hist.First(kubeletorder.After(deleted.RV, kubeletorder.NodeNamed(node, func(n *v1.Node) bool {
			return kubeletorder.InUse(n, kubenames.UniqueVolumeName(w.driver, pv))
		}))); ok {
			late++
		}
		for _, c := range kubeletorder.VolumeCalls(w.mock.Calls(), pv, stack.NodeID(node)) {
			if c.Method == "NodeStageVolume" || c.Method == "NodePublishVolume" {
				t.Logf("%s of %s on %s (#%d at %s, %s)", c.Method, pv, node, c.ID, kubeletorder.Stamp(c.Start), c.CodeName)
			}
		}
	}
	t.Logf("%d of %d rounds saw the kubelet list the volume in volumesInUse after its VolumeAttachment's deletion", late, rounds)
	w.checkNothingLeft(time.Minute)
	if n := w.checkDetaches(); n != rounds {
		t.Errorf("%d detaches checked, want %d", n, rounds)
	}
}

// TestRealKubelet_attacherKilledMidUnpublish_detachPassesTheOrderCheck:
// csi-attacher is killed while its ControllerUnpublish is slow in the
// driver; the new instance unpublishes again, at once, and removes the
// finalizer; the dead instance's call ends later, OK. The volume was
// unpublished (by the new instance's call) before the VolumeAttachment
// went: the detach passes CheckDetach. The chaos run found this (seed
// 1795672800539770089: CheckDetach reported "removed before
// ControllerUnpublish ended", reading the dead instance's call).
func TestRealKubelet_attacherKilledMidUnpublish_detachPassesTheOrderCheck(t *testing.T) {
	w := newKubeletWorld(t, controller.Config{}, 1)
	node := w.nodes[0]
	pv := w.volume("slow")
	if err := w.pod("p", node, pv); err != nil {
		t.Fatal(err)
	}
	w.waitRunning("p")
	// Slower than the new instance takes to start, within the attacher's
	// CSI timeout (attacherConfig: 3 s): the dead instance's call
	// succeeds late.
	w.fault(csimock.Rule{Method: "ControllerUnpublishVolume", Times: 1, Latency: 2500 * time.Millisecond})
	w.deletePod("p")
	w.eventually(90*time.Second, "ControllerUnpublish of "+pv+" in flight", func() bool { return w.inFlight("ControllerUnpublishVolume", pv) })
	w.killAttacher()
	w.waitGone(pv, node)
	w.eventually(10*time.Second, "every ControllerUnpublish of "+pv+" ended", func() bool { return !w.inFlight("ControllerUnpublishVolume", pv) })
	ok := 0
	for _, c := range w.mock.CallsTo("ControllerUnpublishVolume") {
		if c.VolumeID == pv && c.Code == codes.OK {
			ok++
		}
	}
	if ok < 2 {
		t.Fatalf("%d successful ControllerUnpublish calls of %s, want the dead instance's and the new one's:\n%s", ok, pv, kubeletorder.CallTable(w.mock.CallsTo("ControllerUnpublishVolume")))
	}
	w.waitPodGone("p")
	w.checkNothingLeft(time.Minute)
	if n := w.checkDetaches(); n != 1 {
		t.Errorf("%d detaches checked, want 1", n)
	}
}
