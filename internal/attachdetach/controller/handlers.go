package controller

import (
	"context"
	"fmt"
	"slices"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/attachdetach/decide"
	"github.com/latchcsi/latch/internal/attachdetach/state"
	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// Event handlers. They never call the API server: they update the
// in-memory state where the change is a plain observation (a node's
// volumesInUse, a node appearing) and wake (wake.go) the keys, Pods or
// nodes the change affects. The one exception to "wake, do not work" is
// the Pod handler: it records the Pod in the desired state at once
// (syncPod: resolving its volumes reads only listers), so a new Pod's
// first queue pass is that of its key, which creates the VolumeAttachment.
// Everything that calls the API server happens in a worker.

func (c *Controller) addHandlers(ctx context.Context, nodes, pvcs, drivers, vas, csiNodes cache.SharedIndexInformer) error {
	handlers := []struct {
		inf cache.SharedIndexInformer
		h   cache.ResourceEventHandler
	}{
		{c.pods, kube.ChangeHandlers(func(old, obj any) { c.podChanged(ctx, old, obj) }, onDelete(func(pod *cachedPod) { c.podDeleted(ctx, pod) }))},
		{nodes, kube.ChangeHandlers(c.nodeChanged, onDelete(c.nodeDeleted))},
		{pvcs, kube.ChangeHandlers(c.pvcChanged, deleteAsChange(c.pvcChanged))},
		{c.pvs, kube.ChangeHandlers(c.pvChanged, deleteAsChange(c.pvChanged))},
		{drivers, kube.ChangeHandlers(c.csiDriverChanged, deleteAsChange(c.csiDriverChanged))},
		{vas, kube.ChangeHandlers(c.vaChanged, onDelete(c.vaDeleted))},
		{csiNodes, kube.ChangeHandlers(c.csiNodeChanged, onDelete(c.csiNodeDeleted))},
	}
	for _, h := range handlers {
		reg, err := h.inf.AddEventHandler(h.h)
		if err != nil {
			return fmt.Errorf("add event handler: %w", err)
		}
		// Run waits until every handler has seen its informer's initial
		// list, not only until the caches hold it: the rebuild then
		// follows every wake-up of the initial events, and releaseKeys
		// sorts the keys they woke with the rebuild's own.
		c.synced = append(c.synced, reg.HasSynced)
	}
	return nil
}

// deleteAsChange is the delete handler of kinds whose delete is handled
// as a change to nothing; a tombstone is unwrapped.
func deleteAsChange(changed func(old, new any)) func(obj any) {
	return func(obj any) { changed(nil, tombstone(obj)) }
}

// onDelete is the delete handler of a kind whose delete handler takes the
// deleted object: a tombstone is unwrapped, an object of another type
// ignored.
func onDelete[T any](deleted func(T)) func(obj any) {
	return func(obj any) {
		if t, ok := tombstone(obj).(T); ok {
			deleted(t)
		}
	}
}

func tombstone(obj any) any {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return t.Obj
	}
	return obj
}

// --- Pods ---

func (c *Controller) podChanged(ctx context.Context, oldObj, obj any) {
	pod, ok := obj.(*cachedPod)
	if !ok || pod.nodeName == "" {
		return
	}
	if old, ok := oldObj.(*cachedPod); ok && old.uid == pod.uid && podVolumesUnchanged(old, pod) {
		// Status updates (the common case) change nothing the controller
		// looks at; spec.volumes and spec.nodeName are immutable.
		return
	}
	c.recordPod(ctx, pod.namespace, pod.name)
}

// recordPod records the Pod namespace/name in the desired state now (a
// Pod pass run by the informer's handler), unless wakes are held while the
// controller rebuilds its state at start. A pass that fails goes to the
// Pod queue, which retries it with backoff.
func (c *Controller) recordPod(ctx context.Context, namespace, name string) {
	key := state.PodKey(namespace, name)
	if c.wake.HoldPod(key) {
		return
	}
	if _, err := c.syncPod(ctx, key); err != nil {
		klog.FromContext(ctx).V(2).Info("Recording a Pod failed; the Pod queue retries it", "pod", klog.KRef(namespace, name), "err", err)
		c.wake.Pod(namespace, name)
	}
}

// podVolumesUnchanged: only whether the pod still needs its volumes can
// change after scheduling (it terminated, or is being deleted).
func podVolumesUnchanged(old, pod *cachedPod) bool {
	return old.nodeName == pod.nodeName && old.needsVolumes() == pod.needsVolumes()
}

func (c *Controller) podDeleted(ctx context.Context, pod *cachedPod) {
	c.recordPod(ctx, pod.namespace, pod.name)
}

// --- PVCs, PVs, CSIDrivers: re-resolve the Pods that use them ---

func (c *Controller) pvcChanged(oldObj, obj any) {
	pvc, ok := obj.(*v1.PersistentVolumeClaim)
	if !ok {
		return
	}
	if old, ok := oldObj.(*v1.PersistentVolumeClaim); ok && old.UID == pvc.UID &&
		old.Spec.VolumeName == pvc.Spec.VolumeName && old.Status.Phase == pvc.Status.Phase {
		return
	}
	c.wake.PodsBy(podByClaimIndex, claimKey(pvc.Namespace, pvc.Name))
}

func (c *Controller) pvChanged(oldObj, obj any) {
	pv, ok := obj.(*v1.PersistentVolume)
	if !ok {
		return
	}
	if old, ok := oldObj.(*v1.PersistentVolume); ok && old.UID == pv.UID &&
		apiequality.Semantic.DeepEqual(old.Spec, pv.Spec) {
		return
	}
	if ref := pv.Spec.ClaimRef; ref != nil {
		c.wake.PodsBy(podByClaimIndex, claimKey(ref.Namespace, ref.Name))
	}
}

func (c *Controller) csiDriverChanged(oldObj, obj any) {
	drv, ok := obj.(*storagev1.CSIDriver)
	if !ok {
		return
	}
	if old, ok := oldObj.(*storagev1.CSIDriver); ok && attachRequired(old) == attachRequired(drv) {
		return
	}
	c.wake.PodsOfDriver(drv.Name)
}

func attachRequired(d *storagev1.CSIDriver) bool {
	return d.Spec.AttachRequired == nil || *d.Spec.AttachRequired
}

// --- Nodes ---

func (c *Controller) nodeChanged(oldObj, obj any) {
	node, ok := obj.(*v1.Node)
	if !ok {
		return
	}
	old, _ := oldObj.(*v1.Node)
	_, managed := node.Annotations[kubenames.ControllerManagedAttachAnnotation]
	wasManaged := c.dsw.NodeManaged(node.Name)
	c.wake.Volumes(c.dsw.AddNode(node.Name, managed))
	if !managed {
		c.returning.forget(node.Name)
	}
	if managed && !wasManaged && c.rebuilt.Load() {
		// The node came back (re-created, or managed again): until its
		// Pods are recorded again, nothing on it is detached
		// (returningNodes). Noted before the volumesInUse below wakes
		// any key.
		c.nodeCameBack(node.Name)
	}
	// The node's volumesInUse decides which detaches may go ahead.
	c.wake.Keys(c.asw.SetVolumesInUse(node.Name, node.Status.VolumesInUse))
	if managed && !wasManaged {
		// Pods that arrived before the node (or before it was managed)
		// were not recorded; record them now.
		c.wake.PodsBy(podByNodeIndex, node.Name)
	}
	if old == nil || decide.NodeFactsOf(old) != decide.NodeFactsOf(node) {
		// Readiness and the out-of-service taint change detach rules.
		c.wake.NodeKeys(node.Name)
	}
	if old == nil || !slices.Equal(old.Status.VolumesAttached, node.Status.VolumesAttached) {
		c.wake.NodeStatus(node.Name)
	}
}

// nodeCameBack notes the Pods on node that must be recorded again before
// anything on it is detached.
func (c *Controller) nodeCameBack(node string) {
	pods, err := c.podStore.byIndex(podByNodeIndex, node)
	if err != nil {
		return
	}
	keys := make([]string, 0, len(pods))
	for _, pod := range pods {
		keys = append(keys, state.PodKey(pod.namespace, pod.name))
	}
	c.returning.start(node, keys)
	if len(keys) > 0 {
		c.handlerLogger.Info("Node came back; its volumes are not detached until its Pods are recorded again", "node", klog.KRef("", node), "pods", len(keys))
	}
}

func (c *Controller) nodeDeleted(node *v1.Node) {
	c.returning.forget(node.Name)
	c.coexist.nodeGone(node.Name)
	c.wake.Volumes(c.dsw.DeleteNode(node.Name))
	c.asw.DeleteNode(node.Name)
	c.wake.NodeKeys(node.Name)
	c.wake.NodeStatus(node.Name)
}

// --- VolumeAttachments ---

func (c *Controller) vaChanged(oldObj, obj any) {
	va, ok := obj.(*storagev1.VolumeAttachment)
	if !ok {
		return
	}
	if old, ok := oldObj.(*storagev1.VolumeAttachment); ok && old.UID == va.UID && sameVAFacts(decide.VAFactsOf(old), decide.VAFactsOf(va)) {
		// csi-attacher's finalizer and annotation writes change nothing
		// the decision looks at.
		return
	}
	c.wake.VolumeAttachmentChanged(va.Name, state.VersionOf(string(va.UID), va.ResourceVersion))
}

func (c *Controller) vaDeleted(va *storagev1.VolumeAttachment) {
	c.vaCache.Gone(va)
	c.wake.VolumeAttachment(va.Name)
	c.timing.detached(va.Name, c.clock.Now(), c.metrics)
}

func sameVAFacts(a, b decide.VAFacts) bool {
	return a.Exists == b.Exists && a.Attached == b.Attached && a.Deleting == b.Deleting &&
		sameVolumeError(a.AttachError, b.AttachError) && sameVolumeError(a.DetachError, b.DetachError)
}

func sameVolumeError(a, b *storagev1.VolumeError) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Message == b.Message && a.Time.Equal(&b.Time)
}
