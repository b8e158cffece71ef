package interop

import (
	"context"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	csitrans "k8s.io/csi-translation-lib"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/localcluster"
)

// outcome is what a scenario observed, as facts that must be equal on
// every pair (a fact that legitimately differs is normalised or asserted
// in the scenario, with the doc that explains it).
type outcome []string

func (o *outcome) add(format string, args ...any) { *o = append(*o, fmt.Sprintf(format, args...)) }

// scenario is one row of the matrix.
type scenario struct {
	name string
	run  func(w *world, o *outcome)
}

var scenarios = []scenario{
	{"pv-attach-detach", pvAttachDetach},
	{"inline-migrated-attach-detach", inlineAttachDetach},
	{"rwo-multi-attach-then-release", rwoMultiAttach},
	{"rwx-two-nodes", rwxTwoNodes},
	{"notready-forced-detach-after-timeout", notReadyForcedDetach},
	{"out-of-service-taint", outOfServiceTaint},
	{"failing-driver-recovers", failingDriverRecovers},
}

// published records the driver's successful ControllerPublishVolume calls
// of handle on node: exactly want for latch's attacher; at least want for
// upstream's, which may publish again after reading its own write from a
// stale cache (docs/migration.md, "What changes").
func (w *world) published(o *outcome, handle, node string, want int) {
	w.t.Helper()
	w.countCalls(o, "ControllerPublishVolume", handle, node, want)
}

func (w *world) unpublished(o *outcome, handle, node string, want int) {
	w.t.Helper()
	w.eventually(fmt.Sprintf("ControllerUnpublishVolume of %s on %s", handle, node), func(context.Context) (bool, error) {
		return w.calls("ControllerUnpublishVolume", handle, node)[codes.OK] >= want, nil
	})
	w.countCalls(o, "ControllerUnpublishVolume", handle, node, want)
}

func (w *world) countCalls(o *outcome, method, handle, node string, want int) {
	w.t.Helper()
	got := w.calls(method, handle, node)[codes.OK]
	if w.pair.at == latchAt && got != want || got < want {
		w.t.Errorf("%s of %s on %s: %d successful calls, want %d", method, handle, node, got, want)
	}
	o.add("%s %s on %s: OK", method, handle, node)
}

func pvAttachDetach(w *world, o *outcome) {
	ns := w.namespace("pv")
	pv := w.volume(ns, "pv-1")
	w.pod(ns, "app", "node-a", pv)
	va := w.waitAttached(pv, "node-a")
	w.waitNodeAttached("node-a", unique(pv))
	w.waitPodRunning(ns, "app")
	o.add("VA %s", vaFacts(va))
	o.add("event %s", w.waitEvent(ns, "app", "SuccessfulAttachVolume", pv))
	o.add("PV finalizers while attached %v", w.pvFinalizers(pv))
	w.published(o, pv, "node-a", 1)

	w.deletePod(ns, "app")
	w.waitVAGone(pv, "node-a")
	w.waitNodeAttached("node-a")
	w.unpublished(o, pv, "node-a", 1)
	if got := w.drv.Published(pv); len(got) != 0 {
		w.t.Errorf("%s still published to %v after the detach", pv, got)
	}
	// Once the PV is deleted the attacher's finalizer goes (no VA refers
	// to it); kubernetes.io/pv-protection stays: its controller is kcm's
	// pv-protection controller, which no world runs.
	if err := w.s.Client.CoreV1().PersistentVolumes().Delete(w.ctx, pv, metav1.DeleteOptions{}); err != nil {
		w.t.Fatal(err)
	}
	w.eventually("the attacher's finalizer off the deleted PV "+pv, func(ctx context.Context) (bool, error) {
		return len(w.pvFinalizers(pv)) == 0, nil
	})
	o.add("PV deleted after detach: attacher finalizer removed")
}

// inlineAttachDetach: a Pod's inline in-tree GCE PD volume is migrated to
// the CSI driver (KCM 1.36: every migration complete) and attached
// through a VolumeAttachment with spec.source.inlineVolumeSpec.
func inlineAttachDetach(w *world, o *outcome) {
	ns := w.namespace("inline")
	vol := v1.Volume{Name: "disk", VolumeSource: v1.VolumeSource{GCEPersistentDisk: &v1.GCEPersistentDiskVolumeSource{PDName: "inline-1", FSType: "ext4"}}}
	pv, err := csitrans.New().TranslateInTreeInlineVolumeToCSI(klog.Background(), &vol, ns)
	if err != nil {
		w.t.Fatal(err)
	}
	handle := pv.Spec.CSI.VolumeHandle
	pod := localcluster.NewPod(ns, "app", "node-b")
	pod.Spec.Volumes = []v1.Volume{vol}
	if _, err := w.s.Client.CoreV1().Pods(ns).Create(w.ctx, pod, metav1.CreateOptions{}); err != nil {
		w.t.Fatal(err)
	}
	va := w.waitAttached(handle, "node-b")
	w.waitNodeAttached("node-b", unique(handle))
	w.waitPodRunning(ns, "app")
	o.add("VA %s", vaFacts(va))
	o.add("event %s", w.waitEvent(ns, "app", "SuccessfulAttachVolume", "AttachVolume.Attach succeeded"))
	w.published(o, handle, "node-b", 1)

	w.deletePod(ns, "app")
	w.waitVAGone(handle, "node-b")
	w.waitNodeAttached("node-b")
	w.unpublished(o, handle, "node-b", 1)
}

// kcmMultiAttachPrefix is how kube-controller-manager v1.37.2 begins its
// Multi-Attach event (pkg/controller/volume/attachdetach/reconciler).
const kcmMultiAttachPrefix = "Waiting for detach"

func rwoMultiAttach(w *world, o *outcome) {
	ns := w.namespace("rwo")
	pv := w.volume(ns, "rwo-1", v1.ReadWriteOnce)
	w.pod(ns, "first", "node-a", pv)
	w.waitAttached(pv, "node-a")
	w.waitPodRunning(ns, "first")

	w.pod(ns, "second", "node-b", pv)
	// kube-controller-manager v1.37.2 (since v1.36.5) begins this event
	// with "Waiting for detach" where older ones and latch's
	// attachdetach-controller write "Multi-Attach error"; the reason and
	// the rest of the text are the same, and the outcome compares those.
	prefix := "Multi-Attach error"
	if w.pair.ad == kcmAD {
		prefix = kcmMultiAttachPrefix
	}
	o.add("event %s", strings.Replace(w.waitEvent(ns, "second", "FailedAttachVolume", prefix), prefix, "<Multi-Attach prefix>", 1))
	w.consistently("no VolumeAttachment of "+pv+" on node-b while attached to node-a", 2*time.Second, func(context.Context) (bool, error) {
		_, ok := w.getVA(vaName(pv, "node-b"))
		return !ok, nil
	})

	w.deletePod(ns, "first")
	w.waitVAGone(pv, "node-a")
	va := w.waitAttached(pv, "node-b")
	w.waitNodeAttached("node-b", unique(pv))
	w.waitNodeAttached("node-a")
	w.waitPodRunning(ns, "second")
	o.add("VA after release %s", vaFacts(va))
	w.unpublished(o, pv, "node-a", 1)
	w.published(o, pv, "node-b", 1)

	w.deletePod(ns, "second")
	w.waitVAGone(pv, "node-b")
	w.unpublished(o, pv, "node-b", 1)
}

func rwxTwoNodes(w *world, o *outcome) {
	ns := w.namespace("rwx")
	pv := w.volume(ns, "rwx-1", v1.ReadWriteMany)
	w.pod(ns, "on-a", "node-a", pv)
	w.pod(ns, "on-b", "node-b", pv)
	for _, n := range worldNodes {
		va := w.waitAttached(pv, n)
		w.waitNodeAttached(n, unique(pv))
		o.add("VA on %s %s", n, vaFacts(va))
		w.published(o, pv, n, 1)
	}
	w.waitPodRunning(ns, "on-a")
	w.waitPodRunning(ns, "on-b")
	if got := w.events(ns, "on-b", "FailedAttachVolume"); len(got) != 0 {
		w.t.Errorf("FailedAttachVolume on a ReadWriteMany volume's second Pod: %v", got)
	}
	w.deletePod(ns, "on-a")
	w.waitVAGone(pv, "node-a")
	if _, ok := w.getVA(vaName(pv, "node-b")); !ok {
		w.t.Errorf("the VolumeAttachment on node-b went with the Pod on node-a")
	}
	w.deletePod(ns, "on-b")
	w.waitVAGone(pv, "node-b")
	for _, n := range worldNodes {
		w.unpublished(o, pv, n, 1)
		w.waitNodeAttached(n)
	}
}

// downPodAttached puts a Pod with a fresh volume on a node with a
// kubelet of its own (downableNodes), waits for it to run, then takes the
// node down (kubelet gone, NotReady) and deletes the Pod (it stays
// terminating).
func (w *world) downPodAttached(ns, node, pvName string) string {
	w.t.Helper()
	pv := w.volume(ns, pvName)
	w.pod(ns, "app", node, pv)
	w.waitAttached(pv, node)
	w.waitNodeAttached(node, unique(pv))
	w.waitPodRunning(ns, "app")
	w.downNode(node)
	w.deletePod(ns, "app")
	return pv
}

func (w *world) taintOutOfService(node string) {
	w.t.Helper()
	k := w.s.Kubelet
	if err := k.Taint(w.ctx, node, v1.Taint{Key: localcluster.OutOfServiceTaint, Value: "nodeshutdown", Effect: v1.TaintEffectNoExecute}); err != nil {
		w.t.Fatal(err)
	}
}

// notReadyForcedDetach: a volume still in a NotReady node's volumesInUse
// whose Pod is gone is detached after the maximum wait for unmount.
// latch's is --max-wait-for-unmount (3s here); kcm's is fixed at 6
// minutes (no flag), too long for the suite: on the kcm pairs the cell
// asserts the volume is still attached past latch's wait, then releases
// it with the out-of-service taint (docs/interop.md).
func notReadyForcedDetach(w *world, o *outcome) {
	ns := w.namespace("notready")
	const node = "node-notready"
	pv := w.downPodAttached(ns, node, "notready-1")
	if w.pair.ad == kcmAD {
		w.consistently("kcm keeps the volume attached to the NotReady node past 3s (its wait is 6m)", maxWaitForUnmount+3*time.Second, func(context.Context) (bool, error) {
			va, ok := w.getVA(vaName(pv, node))
			return ok && va.DeletionTimestamp == nil, nil
		})
		w.taintOutOfService(node)
	}
	w.waitVAGone(pv, node)
	w.waitNodeAttached(node)
	if inUse := w.node(node).Status.VolumesInUse; len(inUse) != 1 {
		w.t.Errorf("volumesInUse of %s = %v, want the volume still listed (the detach was forced)", node, inUse)
	}
	w.unpublished(o, pv, node, 1)
	o.add("forced detach from the NotReady node: VA gone, node status empty, volume still in use")
}

func outOfServiceTaint(w *world, o *outcome) {
	ns := w.namespace("oos")
	const node = "node-oos"
	pv := w.downPodAttached(ns, node, "oos-1")
	w.consistently("volume attached to the NotReady node before the taint", time.Second, func(context.Context) (bool, error) {
		va, ok := w.getVA(vaName(pv, node))
		return ok && va.DeletionTimestamp == nil, nil
	})
	w.taintOutOfService(node)
	w.waitVAGone(pv, node)
	w.waitNodeAttached(node)
	w.unpublished(o, pv, node, 1)
	o.add("out-of-service taint: VA gone, node status empty")
}

// failingDriverRecovers: ControllerPublishVolume fails (Internal) until
// the driver recovers; the error shows in the VA's status.attachError and
// in a FailedAttachVolume event on the Pod, then the volume attaches.
func failingDriverRecovers(w *world, o *outcome) {
	ns := w.namespace("flaky")
	pv := w.volume(ns, "flaky-1")
	id, err := w.drv.AddFault(csimock.Rule{Method: "ControllerPublishVolume", VolumeID: pv, Code: codes.Internal, Message: "injected: backend busy"})
	if err != nil {
		w.t.Fatal(err)
	}
	w.pod(ns, "app", "node-a", pv)
	w.eventually("attachError on the VolumeAttachment", func(context.Context) (bool, error) {
		va, ok := w.getVA(vaName(pv, "node-a"))
		return ok && va.Status.AttachError != nil, nil
	}, func() { w.logVolume(pv, "node-a") })
	va, _ := w.getVA(vaName(pv, "node-a"))
	// latch's attacher names the operation, volume and node ahead of the
	// driver's error (docs/interop.md, "Differences"); upstream's message
	// is the gRPC error alone. The rest is the same.
	latchPrefix := fmt.Sprintf("ControllerPublishVolume volume %q on node %q: ", pv, "mock-node-a")
	normalise := func(s string) string {
		if w.pair.at != latchAt {
			return s
		}
		if !strings.Contains(s, latchPrefix) {
			w.t.Errorf("latch's attach error %q lacks %q", s, latchPrefix)
		}
		return strings.Replace(s, latchPrefix, "", 1)
	}
	o.add("VA while failing %s", normalise(vaFacts(va)))
	o.add("event %s", normalise(w.waitEvent(ns, "app", "FailedAttachVolume", "injected: backend busy")))
	if got := w.attachedOn("node-a"); len(got) != 0 {
		w.t.Errorf("node-a volumesAttached = %v while the publish fails", got)
	}
	w.drv.RemoveFault(id)
	va = w.waitAttached(pv, "node-a")
	w.waitNodeAttached("node-a", unique(pv))
	w.waitPodRunning(ns, "app")
	o.add("VA after recovery %s", vaFacts(va))
	w.published(o, pv, "node-a", 1)

	w.deletePod(ns, "app")
	w.waitVAGone(pv, "node-a")
	w.waitNodeAttached("node-a")
	w.unpublished(o, pv, "node-a", 1)
}
