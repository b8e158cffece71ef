package interop

import (
	"context"
	"crypto/sha256"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/util/retry"

	"github.com/latchcsi/latch/internal/localcluster"
	"github.com/latchcsi/latch/internal/stack"
	"github.com/latchcsi/latch/internal/testsupport"
)

// wait is how long a scenario waits for one observable step.
const wait = 90 * time.Second

// vaName is the VolumeAttachment name both controllers give the volume
// handle on node: "csi-" + hex(sha256(handle + driver + node)).
func vaName(handle, node string) string {
	return fmt.Sprintf("csi-%x", sha256.Sum256([]byte(handle+driver+node)))
}

func (w *world) eventually(what string, cond func(ctx context.Context) (bool, error), onFail ...func()) {
	w.t.Helper()
	testsupport.Eventually(w.t, w.ctx, wait, what, cond, onFail...)
}

// consistently fails the test if cond turns false within d.
func (w *world) consistently(what string, d time.Duration, cond func(ctx context.Context) (bool, error)) {
	w.t.Helper()
	testsupport.Consistently(w.t, w.ctx, d, what, cond)
}

func (w *world) getVA(name string) (*storagev1.VolumeAttachment, bool) {
	w.t.Helper()
	va, err := w.s.Client.StorageV1().VolumeAttachments().Get(w.ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, false
	}
	if err != nil {
		w.t.Fatal(err)
	}
	return va, true
}

// waitAttached waits for the VA of handle on node to be attached and
// returns it.
func (w *world) waitAttached(handle, node string) *storagev1.VolumeAttachment {
	w.t.Helper()
	var va *storagev1.VolumeAttachment
	w.eventually(fmt.Sprintf("VolumeAttachment of %s on %s attached", handle, node), func(context.Context) (bool, error) {
		got, ok := w.getVA(vaName(handle, node))
		va = got
		return ok && got.Status.Attached, nil
	})
	return va
}

func (w *world) waitVAGone(handle, node string) {
	w.t.Helper()
	w.eventually(fmt.Sprintf("VolumeAttachment of %s on %s gone", handle, node), func(context.Context) (bool, error) {
		_, ok := w.getVA(vaName(handle, node))
		return !ok, nil
	})
}

func (w *world) node(name string) *v1.Node {
	w.t.Helper()
	n, err := w.s.Client.CoreV1().Nodes().Get(w.ctx, name, metav1.GetOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	return n
}

// attachedOn is the node's status.volumesAttached names, sorted.
func (w *world) attachedOn(node string) []string {
	var out []string
	for _, av := range w.node(node).Status.VolumesAttached {
		out = append(out, string(av.Name))
	}
	sort.Strings(out)
	return out
}

func unique(handle string) string { return string(localcluster.UniqueVolumeName(driver, handle)) }

// waitNodeAttached waits until the node lists exactly want (unique
// volume names) in status.volumesAttached.
func (w *world) waitNodeAttached(node string, want ...string) {
	w.t.Helper()
	sort.Strings(want)
	w.eventually(fmt.Sprintf("node %s volumesAttached = %v", node, want), func(context.Context) (bool, error) {
		return slices.Equal(w.attachedOn(node), want), nil
	})
}

func (w *world) waitPodRunning(ns, name string) {
	w.t.Helper()
	w.eventually(fmt.Sprintf("pod %s/%s running", ns, name), func(ctx context.Context) (bool, error) {
		p, err := w.s.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		return err == nil && p.Status.Phase == v1.PodRunning, err
	})
}

func (w *world) deletePod(ns, name string) {
	w.t.Helper()
	if err := w.s.Client.CoreV1().Pods(ns).Delete(w.ctx, name, metav1.DeleteOptions{}); err != nil {
		w.t.Fatal(err)
	}
}

// events are the pod's events with reason, as "Type Reason: message".
func (w *world) events(ns, pod, reason string) []string {
	w.t.Helper()
	sel := fields.Set{"involvedObject.name": pod, "reason": reason}.String()
	evs, err := w.s.Client.CoreV1().Events(ns).List(w.ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		w.t.Fatal(err)
	}
	var out []string
	for _, e := range evs.Items {
		out = append(out, e.Type+" "+e.Reason+": "+e.Message)
	}
	sort.Strings(out)
	return slices.Compact(out)
}

func (w *world) waitEvent(ns, pod, reason, contains string) string {
	w.t.Helper()
	var got string
	w.eventually(fmt.Sprintf("event %s on pod %s/%s containing %q", reason, ns, pod, contains), func(context.Context) (bool, error) {
		for _, e := range w.events(ns, pod, reason) {
			if strings.Contains(e, contains) {
				got = e
				return true, nil
			}
		}
		return false, nil
	})
	return got
}

// calls counts the driver's finished calls of method for handle on node
// by result code.
func (w *world) calls(method, handle, node string) map[codes.Code]int {
	out := map[codes.Code]int{}
	for _, c := range w.drv.CallsTo(method) {
		if c.VolumeID == handle && c.NodeID == stack.NodeID(node) && c.Done() {
			out[c.Code]++
		}
	}
	return out
}

// volume creates a bound PV and PVC (name for both, the handle too).
func (w *world) volume(ns, name string, modes ...v1.PersistentVolumeAccessMode) string {
	w.t.Helper()
	_, _, err := localcluster.CreateBoundVolume(w.ctx, w.s.Client, localcluster.VolumeSpec{
		Namespace: ns, Name: name, Driver: driver, AccessModes: modes,
	})
	if apierrors.IsConflict(err) {
		// kube-controller-manager's PV binder (newHollowWorld) bound the
		// pre-bound pair and wrote the PVC between its create and
		// CreateBoundVolume's status write.
		err = w.markPVCBound(ns, name)
	}
	if err != nil {
		w.t.Fatal(err)
	}
	w.volumeAt = time.Now()
	return name
}

// kcmPVGrace is how long after creating a volume a world of kube-
// controller-manager's attach/detach controller waits before creating a
// Pod that uses it. That controller has no PersistentVolume event
// handler: a Pod (or PVC) event it handles while the PV is not yet in its
// informer's cache is dropped until its next full Pod list, 3 minutes
// later (DesiredStateOfWorldPopulatorListPodsRetryDuration), and a Pod
// created milliseconds after its PV can reach it first (separate watch
// streams). In a cluster the scheduler and the kubelet's first status
// write put time and a second Pod event between the two; the worlds set
// spec.nodeName at once, so they wait instead (docs/interop.md).
const kcmPVGrace = time.Second

func (w *world) pod(ns, name, node string, claims ...string) {
	w.t.Helper()
	if w.pair.ad == kcmAD && len(claims) > 0 {
		time.Sleep(time.Until(w.volumeAt.Add(kcmPVGrace)))
	}
	if _, err := w.s.Client.CoreV1().Pods(ns).Create(w.ctx, localcluster.NewPod(ns, name, node, claims...), metav1.CreateOptions{}); err != nil {
		w.t.Fatal(err)
	}
}

// namespace creates a namespace with its "default" ServiceAccount, which
// kube-controller-manager's service-account controller may have created
// first where it runs.
func (w *world) namespace(name string) string {
	w.t.Helper()
	ns := &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := w.s.Client.CoreV1().Namespaces().Create(w.ctx, ns, metav1.CreateOptions{}); err != nil {
		w.t.Fatalf("create namespace %s: %v", name, err)
	}
	sa := &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: name, Name: "default"}}
	if _, err := w.s.Client.CoreV1().ServiceAccounts(name).Create(w.ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		w.t.Fatalf("create the default ServiceAccount in %s: %v", name, err)
	}
	return name
}

// pvFinalizers are the PV's finalizers other than the API server's own.
func (w *world) pvFinalizers(name string) []string {
	w.t.Helper()
	pv, err := w.s.Client.CoreV1().PersistentVolumes().Get(w.ctx, name, metav1.GetOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	var out []string
	for _, f := range pv.Finalizers {
		if f != "kubernetes.io/pv-protection" {
			out = append(out, f)
		}
	}
	return out
}

// vaFacts is what a VolumeAttachment shows, for comparing pairs.
func vaFacts(va *storagev1.VolumeAttachment) string {
	src := "?"
	switch {
	case va.Spec.Source.PersistentVolumeName != nil:
		src = "pv:" + *va.Spec.Source.PersistentVolumeName
	case va.Spec.Source.InlineVolumeSpec != nil:
		src = "inline"
		if c := va.Spec.Source.InlineVolumeSpec.CSI; c != nil {
			src = "inline-csi:" + c.VolumeHandle
		} else if g := va.Spec.Source.InlineVolumeSpec.GCEPersistentDisk; g != nil {
			src = "inline-gce-pd:" + g.PDName
		}
	}
	errMsg := ""
	if va.Status.AttachError != nil {
		errMsg = " attachError=" + va.Status.AttachError.Message
	}
	return fmt.Sprintf("attacher=%s node=%s source=%s attached=%v finalizers=%v nodeID=%s%s",
		va.Spec.Attacher, va.Spec.NodeName, src, va.Status.Attached, va.Finalizers,
		va.Annotations["csi.alpha.kubernetes.io/node-id"], errMsg)
}

// logVolume logs what a failed wait needs to tell "no VolumeAttachment
// was made" (the attach/detach controller) from "it was not acted on"
// (the attacher): the VolumeAttachment of handle on node, if any, and
// the driver's calls for the volume.
func (w *world) logVolume(handle, node string) {
	w.t.Helper()
	if va, ok := w.getVA(vaName(handle, node)); ok {
		w.t.Logf("VolumeAttachment %s: %s", va.Name, vaFacts(va))
	} else {
		w.t.Logf("no VolumeAttachment of %s on %s: the attach/detach controller made none", handle, node)
	}
	for _, m := range []string{"ControllerPublishVolume", "ControllerUnpublishVolume"} {
		w.t.Logf("%s of %s on %s by result: %v", m, handle, node, w.calls(m, handle, node))
	}
}

// markPVCBound sets the PVC's status to Bound unless it already is.
func (w *world) markPVCBound(ns, name string) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pvc, err := w.s.Client.CoreV1().PersistentVolumeClaims(ns).Get(w.ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if pvc.Status.Phase == v1.ClaimBound {
			return nil
		}
		pvc.Status.Phase = v1.ClaimBound
		pvc.Status.AccessModes = pvc.Spec.AccessModes
		pvc.Status.Capacity = pvc.Spec.Resources.Requests
		_, err = w.s.Client.CoreV1().PersistentVolumeClaims(ns).UpdateStatus(w.ctx, pvc, metav1.UpdateOptions{})
		return err
	})
}
