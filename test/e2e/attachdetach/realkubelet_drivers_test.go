package attachdetach_test

// Tests of the CSIDriver's attachRequired on the real kubelet: a Pod with
// volumes of two drivers, one needing no attach (its node plugin served
// beside the test driver's on the same hollow node), and a driver that
// turns to needing attach under a running Pod.

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/latchcsi/latch/internal/attachdetach/controller"
	"github.com/latchcsi/latch/internal/csi"
	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/kube/kubenames"
	"github.com/latchcsi/latch/internal/localcluster"
	"github.com/latchcsi/latch/internal/testsupport/kubeletorder"
)

// A Pod with a volume of a driver that needs no attach
// (attachRequired=false) and one of the test's driver. The kubelet
// mounts the first through that driver's own node plugin with no
// VolumeAttachment ever made and without listing it in volumesInUse; the
// second is attached through a VolumeAttachment first (CheckAttach). On
// the Pod's deletion the kubelet unmounts both, and only the attached one
// is detached (CheckDetach).
func TestAttachRequiredFalse_noVolumeAttachment(t *testing.T) {
	e := newRealKubeletEnv(t, controller.Config{Workers: 4})
	noAttach := e.prefix + "-noattach.csi.latch.test"
	if _, err := e.client.StorageV1().CSIDrivers().Create(e.ctx, localcluster.NewCSIDriver(noAttach, ptr.To(false)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.client.StorageV1().CSIDrivers().Delete(context.WithoutCancel(e.ctx), noAttach, metav1.DeleteOptions{})
	})
	// The driver that needs no attach: no controller service, so its node
	// plugin stages any volume it has.
	cfg := csimock.DefaultConfig()
	cfg.Name, cfg.NodeService = noAttach, false
	cfg.Capabilities.ControllerService, cfg.Capabilities.PublishUnpublishVolume = false, false
	plainDriver, err := csimock.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	node := e.addHollowNodeWith(e.prefix+"-n1", plainDriver)
	nodeID := e.nodeID(node)
	plain := e.volumeOf(noAttach, e.prefix+"-plain", rwo())
	if err := plainDriver.SeedVolume(csimock.VolumeSpec{ID: plain}); err != nil {
		t.Fatal(err)
	}
	attached := e.volume("attached", rwo())
	e.pod("app", node, plain, attached)
	// The Pod runs once the attachable volume is attached; by then the
	// controller has decided about both volumes of the Pod.
	e.waitAttachedVA(attached, node)
	e.waitPodRunning("app") // checks the attach of attached
	if _, ok := e.getVA(kubeVAName(plain, noAttach, node)); ok {
		t.Error("VolumeAttachment created for a driver with attachRequired=false")
	}
	e.waitNodeAttached(node, e.unique(attached))
	// The kubelet mounted plain through its own node plugin, with no
	// attach: NodeStage → NodePublish on this node's endpoint.
	stage, publish := plainMount(t, plainDriver, plain, nodeID)
	if nv := plainDriver.NodeVolumes(nodeID); nv.Staged[plain] == "" || len(nv.Published[plain]) != 1 {
		t.Errorf("%s not staged and published once on %s: %+v", plain, node, nv)
	}
	// It reports only the attachable volume in use.
	e.eventually("volumesInUse of "+node+" = ["+string(e.unique(attached))+"]", func() (bool, error) {
		return slices.Equal(e.node(node).Status.VolumesInUse, []v1.UniqueVolumeName{e.unique(attached)}), nil
	})

	e.deletePod("app")
	e.waitPodGone("app") // the kubelet removes it once both volumes are unmounted
	e.waitVAGone(attached, node)
	e.waitNodeAttached(node)
	// plain was unmounted (NodeUnpublish → NodeUnstage, after its mount),
	// and its driver got no other call for it.
	calls := kubeletorder.VolumeCalls(plainDriver.Calls(), plain, nodeID)
	unpublish, ok1 := kubeletorder.FindNodeCall(calls, "NodeUnpublishVolume", plain, nodeID, codes.OK)
	unstage, ok2 := kubeletorder.FindNodeCall(calls, "NodeUnstageVolume", plain, nodeID, codes.OK)
	if !ok1 || !ok2 || !publish.End.Before(unpublish.Start) || !unpublish.End.Before(unstage.Start) {
		t.Errorf("want NodeStage (#%d) → NodePublish (#%d) → NodeUnpublish → NodeUnstage of %s on %s, got\n%s", stage.ID, publish.ID, plain, nodeID, kubeletorder.CallTable(calls))
	}
	for _, c := range plainDriver.Calls() {
		if c.VolumeID == plain && !kubeletorder.IsNodeMethod(c.Method) {
			t.Errorf("%s of %s (#%d) to a driver that needs no attach", c.Method, plain, c.ID)
		}
	}
	if nv := plainDriver.NodeVolumes(nodeID); len(nv.Staged) != 0 || len(nv.Published) != 0 {
		t.Errorf("%s still holds volumes of %s after the Pod's deletion: %+v", node, noAttach, nv)
	}
	// From the API history: no VolumeAttachment of the driver that needs
	// no attach ever existed, and the node never listed plain as attached
	// or in use.
	if c, ok := e.real.hist.First(func(c kubeletorder.Change) bool {
		va, ok := c.Obj.(*storagev1.VolumeAttachment)
		return ok && va.Spec.Attacher == noAttach
	}); ok {
		t.Errorf("a VolumeAttachment of %s: %s", noAttach, c)
	}
	plainUnique := kubenames.UniqueVolumeName(noAttach, plain)
	if c, ok := e.real.hist.First(kubeletorder.NodeNamed(node, func(n *v1.Node) bool {
		return kubeletorder.InUse(n, plainUnique) || slices.Contains(attachedNames(n), plainUnique)
	})); ok {
		t.Errorf("Node %s listed %s as attached or in use: %s", node, plain, c)
	}
	if got := e.createCount(); got != 1 {
		t.Errorf("VolumeAttachment creates = %d, want 1 (the attachable volume's)", got)
	}
}

// plainMount is the NodeStage and NodePublish that mounted vol on nodeID
// through d's node plugin, in that order.
func plainMount(t *testing.T, d *csimock.Driver, vol, nodeID string) (stage, publish csimock.Call) {
	t.Helper()
	calls := kubeletorder.VolumeCalls(d.Calls(), vol, nodeID)
	stage, ok1 := kubeletorder.FindNodeCall(calls, "NodeStageVolume", vol, nodeID, codes.OK)
	publish, ok2 := kubeletorder.FindNodeCall(calls, "NodePublishVolume", vol, nodeID, codes.OK)
	if !ok1 || !ok2 || stage.Endpoint != nodeID || publish.Endpoint != nodeID || !stage.End.Before(publish.Start) {
		t.Fatalf("want NodeStage → NodePublish of %s on %s's endpoint, got\n%s", vol, nodeID, kubeletorder.CallTable(calls))
	}
	return stage, publish
}

// deleteCSIDriver deletes CSIDriver name, unchanged since rv, and
// returns the resourceVersion of its deletion (a watch's DELETED event
// carries the deletion's revision), which orders it against the API
// history's changes.
func (e *env) deleteCSIDriver(name, rv string) uint64 {
	e.t.Helper()
	w, err := e.client.StorageV1().CSIDrivers().Watch(e.ctx, metav1.ListOptions{ResourceVersion: rv, FieldSelector: "metadata.name=" + name})
	if err != nil {
		e.t.Fatal(err)
	}
	defer w.Stop()
	if err := e.client.StorageV1().CSIDrivers().Delete(e.ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv}}); err != nil {
		e.t.Fatalf("delete CSIDriver %s: %v", name, err)
	}
	timer := time.NewTimer(e.wait)
	defer timer.Stop()
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				e.t.Fatalf("watch of CSIDriver %s ended before its deletion", name)
			}
			if ev.Type != "DELETED" {
				continue
			}
			d := ev.Object.(*storagev1.CSIDriver)
			return mustRV(e.t, d.ResourceVersion)
		case <-timer.C:
			e.t.Fatalf("no DELETED event of CSIDriver %s within %s", name, e.wait)
		}
	}
}

func mustRV(t *testing.T, rv string) uint64 {
	t.Helper()
	n, err := strconv.ParseUint(rv, 10, 64)
	if err != nil {
		t.Fatalf("resourceVersion %q: %v", rv, err)
	}
	return n
}

// A CSIDriver change re-evaluates the Pods using that driver:
// attachRequired=false at first (no VolumeAttachment; the kubelet mounts
// the volume without one), then the CSIDriver object is deleted
// (attachRequired is immutable; no object means attach required), and
// the running Pod's volume gets attached without any change to the Pod.
//
// On the real kubelet the volume was staged and published before any
// attach, so kubeletorder.CheckAttach (no Node call before
// ControllerPublish, the Pod Running only after the attach) cannot hold;
// what the test asserts instead: the VolumeAttachment is created only
// after the CSIDriver's deletion (by resourceVersion), the attach
// neither unmounts, remounts, detaches nor restarts anything, and the
// Pod stays Running, the same object.
//
// The kubelet (v1.37.2) never learns that the mounted volume became
// attachable: its desired state keeps the attachability it computed when
// the Pod was added (populator findAndRemoveDeletedPods turns only
// attachable into non-attachable), and it lists only attachable volumes
// in volumesInUse (volumeManager.GetVolumesInUse). So the Node does not
// report the volume in use, and deleting the Pod now would let the
// controller (as kube-controller-manager, whose reconciler reads the same
// volumesInUse) detach it as soon as the Pod terminates, before the
// kubelet unmounts it. A kubelet restart re-reads the attachability:
// the test restarts the kubelet, waits for the volume in volumesInUse,
// then deletes the Pod, and the detach follows the kubelet's order
// (CheckDetach).
func TestCSIDriverChange_attachRequiredAgain_podVolumeAttached(t *testing.T) {
	e := newRealKubeletEnv(t, controller.Config{Workers: 4})
	drv, err := e.client.StorageV1().CSIDrivers().Create(e.ctx, localcluster.NewCSIDriver(e.driver, ptr.To(false)), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.client.StorageV1().CSIDrivers().Delete(context.WithoutCancel(e.ctx), e.driver, metav1.DeleteOptions{})
	})
	node := e.addNode("n1")
	nodeID := e.nodeID(node)
	pv := e.volume("later", rwo())
	unique := e.unique(pv)
	// The mock refuses to stage a volume not ControllerPublished to the
	// node, as a driver that needs its attach would. This driver needs
	// none at first: its backend already reaches the volume from the
	// node, which a publication made without any call (SeedPublication,
	// with the capability csi-attacher will send) stands for. The later
	// ControllerPublish finds it published already.
	pvObj, err := e.client.CoreV1().PersistentVolumes().Get(e.ctx, pv, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	capability, err := csi.VolumeCapabilityFromPVSpec(&pvObj.Spec, "ext4", true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.stack.Driver.SeedPublication(pv, nodeID, false, capability); err != nil {
		t.Fatal(err)
	}
	e.pod("app", node, pv)
	e.waitPodRunning("app") // no attach to check: attachRequired=false
	before, err := e.client.CoreV1().Pods(e.ns).Get(e.ctx, "app", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	stage, publish := plainMount(t, e.stack.Driver, pv, nodeID)
	e.consistently("no VolumeAttachment while the driver needs no attach", 500*time.Millisecond, func() (bool, error) {
		_, ok := e.getVA(e.vaName(pv, node))
		return !ok, nil
	})
	if calls := e.stack.Driver.CallsTo("ControllerPublishVolume"); len(calls) != 0 {
		t.Errorf("ControllerPublish while the driver needs no attach:\n%s", kubeletorder.CallTable(calls))
	}

	changed := e.deleteCSIDriver(e.driver, drv.ResourceVersion)
	e.waitAttachedVA(pv, node)
	e.waitNodeAttached(node, unique)
	created := e.real.hist.MustFirst(t, "VolumeAttachment of "+pv+" created", kubeletorder.VANamed(e.vaName(pv, node), func(*storagev1.VolumeAttachment) bool { return true }))
	if created.RV <= changed {
		t.Errorf("VolumeAttachment of %s created (%s) before the CSIDriver's deletion (RV %d)", pv, created, changed)
	}
	ctrlPublish, ok := kubeletorder.FindNodeCall(e.stack.Driver.Calls(), "ControllerPublishVolume", pv, nodeID, codes.OK)
	if !ok || !ctrlPublish.Start.After(publish.End) {
		t.Errorf("want a ControllerPublish of %s to %s after its mount, got\n%s", pv, nodeID, kubeletorder.CallTable(e.stack.Driver.Calls()))
	}
	// The kubelet keeps the volume mounted as it was, and does not report
	// it in use; the Pod runs on, the same object, its container not
	// restarted; nothing is detached.
	e.consistently("the volume attached and mounted under the running Pod, not in volumesInUse", time.Second, func() (bool, error) {
		va, ok := e.getVA(e.vaName(pv, node))
		n := e.node(node)
		return ok && va.DeletionTimestamp == nil && va.Status.Attached &&
			slices.Equal(attachedNames(n), []v1.UniqueVolumeName{unique}) && !kubeletorder.InUse(n, unique), nil
	})
	for _, c := range kubeletorder.VolumeCalls(e.stack.Driver.Calls(), pv, nodeID) {
		if c.ID != stage.ID && c.ID != publish.ID && c.ID != ctrlPublish.ID {
			t.Errorf("%s of %s (#%d) after the attach: want none before the kubelet's restart", c.Method, pv, c.ID)
		}
	}
	after, err := e.client.CoreV1().Pods(e.ns).Get(e.ctx, "app", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if after.UID != before.UID || after.Status.Phase != v1.PodRunning || restarts(after) != 0 {
		t.Errorf("Pod app changed under the attach: UID %s → %s, phase %s, container restarts %d", before.UID, after.UID, after.Status.Phase, restarts(after))
	}
	running := e.real.hist.MustFirst(t, "Pod app Running", kubeletorder.PodNamed("app", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodRunning }))
	if c, ok := e.real.hist.First(kubeletorder.After(running.RV, kubeletorder.PodNamed("app", func(p *v1.Pod) bool { return p.Status.Phase != v1.PodRunning }))); ok {
		t.Errorf("Pod app left Running under the attach: %s", c)
	}

	// A kubelet restart re-reads the volume's attachability: the node
	// then reports it in use, the Pod runs on.
	e.restartKubeletOf(node)
	e.eventually("volume in use on "+node+" after the kubelet's restart", func() (bool, error) {
		return kubeletorder.InUse(e.node(node), unique), nil
	})
	if got, err := e.client.CoreV1().Pods(e.ns).Get(e.ctx, "app", metav1.GetOptions{}); err != nil || got.UID != before.UID || got.Status.Phase != v1.PodRunning {
		t.Errorf("Pod app after the kubelet's restart: %v, %+v", err, got.Status)
	}

	e.deletePod("app")
	e.waitPodGone("app")
	e.waitVAGone(pv, node) // unmounted, then detached: CheckDetach
	e.waitNodeAttached(node)
	if got := e.createCount(); got != 1 {
		t.Errorf("VolumeAttachment creates = %d, want 1", got)
	}
}

func restarts(p *v1.Pod) int32 {
	var n int32
	for _, s := range p.Status.ContainerStatuses {
		n += s.RestartCount
	}
	return n
}
