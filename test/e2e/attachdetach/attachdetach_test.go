package attachdetach_test

import (
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-base/metrics/testutil"

	"github.com/latchcsi/latch/internal/attachdetach/controller"
	"github.com/latchcsi/latch/internal/kube/kubenames"
	"github.com/latchcsi/latch/internal/localcluster"
)

func rwo() v1.PersistentVolumeAccessMode { return v1.ReadWriteOnce }

func TestPodLifecycle_attachThenDetach(t *testing.T) {
	e := newRealKubeletEnv(t, controller.Config{Workers: 4})
	node := e.addNode("n1")
	pv := e.volume("data", rwo())
	e.pod("app", node, pv)

	va := e.waitAttachedVA(pv, node)
	if va.Spec.Attacher != e.driver || va.Spec.NodeName != node || va.Spec.Source.PersistentVolumeName == nil || *va.Spec.Source.PersistentVolumeName != pv {
		t.Errorf("VolumeAttachment spec = %+v", va.Spec)
	}
	managed := false
	for _, mf := range va.ManagedFields {
		managed = managed || mf.Manager == "latch-attachdetach-controller"
	}
	if !managed {
		t.Errorf("VolumeAttachment has no managedFields entry of the controller: %+v", va.ManagedFields)
	}
	e.waitNodeAttached(node, e.unique(pv))
	e.waitPodRunning("app")
	e.waitEvent("app", "SuccessfulAttachVolume", fmt.Sprintf("AttachVolume.Attach succeeded for volume %q ", pv))
	if got := e.events("app", "SuccessfulAttachVolume"); len(got) != 1 || got[0].Type != v1.EventTypeNormal || got[0].Count > 1 {
		t.Errorf("SuccessfulAttachVolume events = %+v, want exactly one Normal event", got)
	}

	e.deletePod("app")
	e.waitPodGone("app") // the kubelet removes it once its volumes are unmounted
	e.waitVAGone(pv, node)
	e.waitNodeAttached(node)
	if n := e.node(node); len(n.Status.VolumesInUse) != 0 {
		t.Errorf("volumesInUse = %v", n.Status.VolumesInUse)
	}
	if got := e.createCount(); got != 1 {
		t.Errorf("VolumeAttachment creates = %d, want 1", got)
	}
	// The exact API writes, in order: create the VA, list the volume in the
	// node status once attached, drop it from the node status, and only
	// then delete the VA.
	vaPath := "/apis/storage.k8s.io/v1/volumeattachments"
	nodePath := "/api/v1/nodes/" + node + "/status"
	wantWrites := []string{"POST " + vaPath, "PATCH " + nodePath, "PATCH " + nodePath, "DELETE " + vaPath + "/" + e.vaName(pv, node)}
	e.waitControllerWrites(wantWrites)
	// The latency histogram saw the one Pod.
	hist, err := testutil.GetHistogramVecFromGatherer(e.registry, controller.PodVolumesAttachedMetric, nil)
	if err != nil || hist.GetAggregatedSampleCount() != 1 {
		t.Errorf("%s count = %d, %v; want 1", controller.PodVolumesAttachedMetric, hist.GetAggregatedSampleCount(), err)
	}
	// The detach is observed when the controller's informer sees the
	// VolumeAttachment go, which may be after the test's client did.
	e.eventually("one attach and one detach in "+controller.OperationDurationMetric, func() (bool, error) {
		ops, err := testutil.GetHistogramVecFromGatherer(e.registry, controller.OperationDurationMetric, map[string]string{"driver": e.driver})
		return err == nil && ops.GetAggregatedSampleCount() == 2, nil
	})
}

func TestMultiAttach_secondNodeWaitsWithOneEventThenAttaches(t *testing.T) {
	e := newRealKubeletEnv(t, controller.Config{Workers: 4})
	n1, n2 := e.addNode("n1"), e.addNode("n2")
	pv := e.volume("rwo", rwo())
	e.pod("first", n1, pv)
	e.waitAttachedVA(pv, n1)
	e.waitPodRunning("first")

	e.pod("second", n2, pv)
	msg := fmt.Sprintf("Multi-Attach error for volume %q Volume is already used by pod(s) first", pv)
	e.waitEvent("second", "FailedAttachVolume", msg)
	if _, ok := e.getVA(e.vaName(pv, n2)); ok {
		t.Fatal("a VolumeAttachment for the second node exists while the volume is attached to the first")
	}

	e.deletePod("first")
	e.waitVAGone(pv, n1)
	e.waitAttachedVA(pv, n2)
	e.waitNodeAttached(n2, e.unique(pv))
	e.waitNodeAttached(n1)
	e.waitPodRunning("second")

	evs := e.events("second", "FailedAttachVolume")
	if len(evs) != 1 || evs[0].Message != msg || evs[0].Type != v1.EventTypeWarning || evs[0].Count > 1 {
		t.Errorf("FailedAttachVolume events on the second pod = %+v, want exactly one Multi-Attach warning", evs)
	}
}

// downNode stops the kubelet stand-in (so the volume stays in
// volumesInUse, as on a crashed node), marks the node NotReady and deletes
// the Pod (it stays terminating: nobody finishes the deletion).
func downNode(e *env, node, pod string) {
	e.t.Helper()
	e.stopKubelet()
	if err := e.kubelet.SetReady(e.ctx, node, false); err != nil {
		e.t.Fatal(err)
	}
	e.deletePod(pod)
}

func TestOutOfServiceTaint_detachesAtOnce(t *testing.T) {
	e := newEnv(t, controller.Config{Workers: 4}) // default 6m unmount wait
	node, pv, _ := e.runningPod("oos")
	downNode(e, node, "app")
	e.consistently("volume attached to the NotReady node", time.Second, func() (bool, error) {
		_, ok := e.getVA(e.vaName(pv, node))
		return ok, nil
	})

	if err := e.kubelet.Taint(e.ctx, node, v1.Taint{Key: localcluster.OutOfServiceTaint, Value: "nodeshutdown", Effect: v1.TaintEffectNoExecute}); err != nil {
		t.Fatal(err)
	}
	e.waitVAGone(pv, node)
	e.waitNodeAttached(node)
	expectForced(t, e, "out-of-service", 1)
}

func TestNotReadyNode_forcedDetachAfterMaxWaitForUnmount(t *testing.T) {
	e := newEnv(t, controller.Config{Workers: 4, MaxWaitForUnmount: 2 * time.Second})
	node, pv, _ := e.runningPod("timeout")
	downNode(e, node, "app")
	e.waitVAGone(pv, node)
	e.waitNodeAttached(node)
	if inUse := e.node(node).Status.VolumesInUse; len(inUse) != 1 {
		t.Errorf("volumesInUse = %v, want the volume still listed (detach was forced)", inUse)
	}
	expectForced(t, e, "timeout", 1)
}

func TestNotReadyNode_forceDetachDisabledKeepsVolumeAttached(t *testing.T) {
	e := newEnv(t, controller.Config{Workers: 4, MaxWaitForUnmount: time.Second, DisableForceDetachOnTimeout: true})
	node, pv, _ := e.runningPod("noforce")
	downNode(e, node, "app")
	e.consistently("volume attached well past --max-wait-for-unmount", 3*time.Second, func() (bool, error) {
		va, ok := e.getVA(e.vaName(pv, node))
		return ok && va.DeletionTimestamp == nil && len(attachedNames(e.node(node))) == 1, nil
	})
	expectForced(t, e, "timeout", 0)
}

// A node goes away with its volumes mounted, as when its machine is
// deleted: the kubelet stops (nothing unmounts) and the Node object is
// deleted. Both volumes are detached without an unmount, after the Node's
// deletion.
func TestNodeDeleted_volumesDetached(t *testing.T) {
	e := newRealKubeletEnv(t, controller.Config{Workers: 4, MaxWaitForUnmount: 2 * time.Second})
	node := e.addNode("n1")
	pv1, pv2 := e.volume("a", rwo()), e.volume("b", rwo())
	e.pod("app", node, pv1, pv2)
	e.waitAttachedVA(pv1, node)
	e.waitAttachedVA(pv2, node)
	e.waitPodRunning("app")

	e.stopKubeletOf(node)
	if err := e.client.CoreV1().Nodes().Delete(e.ctx, node, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitForcedDetach(pv1, node)
	e.waitForcedDetach(pv2, node)
	vas, err := e.client.StorageV1().VolumeAttachments().List(e.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, va := range vas.Items {
		if va.Spec.NodeName == node {
			t.Errorf("VolumeAttachment %s of the deleted node leaked", va.Name)
		}
	}
}

func TestControllerRestart_rebuildsStateAndDetachesDanglingAttachment(t *testing.T) {
	e := newRealKubeletEnv(t, controller.Config{Workers: 4})
	node := e.addNode("n1")
	kept, dangling, late := e.volume("kept", rwo()), e.volume("dangling", rwo()), e.volume("late", rwo())
	e.pod("kept", node, kept)
	before := e.waitAttachedVA(kept, node)
	e.waitNodeAttached(node, e.unique(kept))
	e.waitPodRunning("kept")

	e.stopController()
	// While no controller runs: a VolumeAttachment whose Pod is gone (the
	// previous leader crashed between the Pod's deletion and the detach)
	// and a new Pod.
	e.createVA(dangling, node)
	e.waitAttachedVA(dangling, node) // the attacher still runs
	e.pod("late", node, late)

	e.resetCreates()
	e.startController()
	e.waitVAGone(dangling, node)
	e.waitAttachedVA(late, node)
	e.waitNodeAttached(node, sortedNames(e.unique(kept), e.unique(late))...)
	e.waitPodRunning("late")
	after, ok := e.getVA(e.vaName(kept, node))
	if !ok || after.UID != before.UID {
		t.Errorf("the kept volume's VolumeAttachment was replaced: before uid %s, after %+v", before.UID, after)
	}
	if got := e.createCount(); got != 1 {
		t.Errorf("VolumeAttachment creates after restart = %d, want 1 (only the new Pod's)", got)
	}
	// The kept Pod's volume stayed mounted through the restart.
	for _, c := range e.stack.Driver.Calls() {
		if c.VolumeID == kept && (c.Method == "NodeUnpublishVolume" || c.Method == "NodeUnstageVolume" || c.Method == "ControllerUnpublishVolume") {
			t.Errorf("%s of the kept volume %s (#%d) across the controller restart", c.Method, kept, c.ID)
		}
	}
}

func sortedNames(names ...v1.UniqueVolumeName) []v1.UniqueVolumeName {
	out := append([]v1.UniqueVolumeName(nil), names...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

func expectForced(t *testing.T, e *env, reason string, want float64) {
	t.Helper()
	// The counter is incremented right after the controller's delete call
	// returns, which can be a moment after the test sees the VA gone.
	var got map[string]float64
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		got, err = testutil.GetCounterValuesFromGatherer(e.registry, controller.ForcedDetachesMetric, nil, "reason")
		if (err == nil || want == 0) && got[reason] == want || time.Now().After(deadline) {
			break
		}
	}
	if err != nil && want > 0 {
		t.Fatalf("gather %s: %v", controller.ForcedDetachesMetric, err)
	}
	if got[reason] != want {
		t.Errorf("%s{reason=%q} = %v, want %v (all: %v)", controller.ForcedDetachesMetric, reason, got[reason], want, got)
	}
}

func kubeVAName(handle, driver, node string) string {
	return kubenames.VolumeAttachmentName(handle, driver, node)
}

func TestVolumeAttachmentOfDeletedPV_deletedWhenNothingWantsIt(t *testing.T) {
	e := newEnv(t, controller.Config{Workers: 4})
	node, pv, _ := e.runningPod("kept")

	// A VolumeAttachment whose PV no longer exists: its volume handle is
	// unknown, so only its name can be matched.
	gone := e.prefix + "-deleted-pv"
	e.createVA(gone, node)
	e.waitVAGone(gone, node)
	if _, ok := e.getVA(e.vaName(pv, node)); !ok {
		t.Error("the VolumeAttachment of the running Pod was deleted too")
	}
	e.waitNodeAttached(node, e.unique(pv))
}

func TestPendingClaim_attachesOnceThePVCIsBound(t *testing.T) {
	e := newRealKubeletEnv(t, controller.Config{Workers: 4})
	node := e.addNode("n1")
	name := e.prefix + "-late-bound"
	pvc := &v1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name},
		Spec: v1.PersistentVolumeClaimSpec{
			AccessModes:      []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			Resources:        v1.VolumeResourceRequirements{Requests: v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")}},
			StorageClassName: new(string),
		},
	}
	pvc, err := e.client.CoreV1().PersistentVolumeClaims(e.ns).Create(e.ctx, pvc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e.pod("app", node, name)
	e.consistently("no VolumeAttachment while the PVC is unbound", 500*time.Millisecond, func() (bool, error) {
		_, ok := e.getVA(e.vaName(name, node))
		return !ok, nil
	})

	// Bind the way the PV controller does: PV with claimRef, then the PVC.
	pv := &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.PersistentVolumeSpec{
			AccessModes:            []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			Capacity:               v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")},
			ClaimRef:               &v1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: e.ns, Name: name, UID: pvc.UID},
			PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: e.driver, VolumeHandle: name}},
		},
	}
	if _, err := e.client.CoreV1().PersistentVolumes().Create(e.ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pvc.Spec.VolumeName = name
	if pvc, err = e.client.CoreV1().PersistentVolumeClaims(e.ns).Update(e.ctx, pvc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pvc.Status.Phase = v1.ClaimBound
	if _, err = e.client.CoreV1().PersistentVolumeClaims(e.ns).UpdateStatus(e.ctx, pvc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitAttachedVA(name, node)
	e.waitNodeAttached(node, e.unique(name))
	e.waitPodRunning("app")
}
