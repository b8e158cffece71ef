package controller

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/attachdetach/decide"
	"github.com/latchcsi/latch/internal/attachdetach/state"
	"github.com/latchcsi/latch/internal/attachdetach/volume"
	"github.com/latchcsi/latch/internal/runner"
)

// syncPod records the volumes the Pod "namespace/name" wants in the
// desired state and enqueues the keys that changed.
//
// The Pod handler runs it for a changed Pod (handlers.go), a Pod queue
// pass for a Pod whose claim, PV, CSIDriver or node changed, or whose
// recording failed; podLocks keeps the two from recording one Pod at once.
func (c *Controller) syncPod(ctx context.Context, key string) (res runner.Result, err error) {
	defer c.podLocks.lock(key)()
	// notRecordedOn is the node of a Pod that needs its volumes but that
	// this pass did not record, because the node was not managed when it
	// looked: the node may have come back since (its handler records the
	// return, then wakes this Pod again), and until a pass records the
	// Pod there, nothing on that node may be detached. Every other node
	// waiting for this Pod key is done with it: the Pod is recorded, gone,
	// terminated, or on another node.
	var notRecordedOn string
	defer func() {
		if err != nil {
			return
		}
		for _, node := range c.returning.recorded(key, notRecordedOn) {
			// The node's last Pod to record again: its detaches may
			// go ahead.
			klog.FromContext(ctx).Info("Pods of the node that came back recorded again; its detaches may go ahead", "node", klog.KRef("", node))
			c.wake.NodeKeys(node)
		}
	}()
	pod, err := c.getPod(key)
	if err != nil {
		return runner.Result{}, fmt.Errorf("get pod %s: %w", key, err)
	}
	rec, known := c.podRec.Get(key)
	if known && (pod == nil || pod.uid != rec.UID) {
		c.wake.Volumes(c.dsw.DeletePod(rec.UID))
		c.podRec.Forget(key)
		known = false
	}
	if pod == nil {
		return runner.Result{}, nil
	}
	if !pod.needsVolumes() || !c.dsw.NodeManaged(pod.nodeName) {
		// Terminated, or on a node the controller does not manage (yet:
		// the node handler re-enqueues its Pods when that changes).
		if pod.needsVolumes() {
			notRecordedOn = pod.nodeName
		}
		c.wake.Volumes(c.dsw.DeletePod(pod.uid))
		c.podRec.Forget(key)
		return runner.Result{}, nil
	}
	if !known {
		rec = state.PodRecord{UID: pod.uid, Node: pod.nodeName, Scheduled: pod.scheduled}
	}
	vols, next, warned := c.resolvePod(ctx, pod, rec)
	rec.Volumes, rec.Warned = next, warned
	changed, ok := c.dsw.AddPod(pod.ref(), pod.nodeName, vols)
	if ok {
		c.podRec.Set(key, rec)
	} else {
		notRecordedOn = pod.nodeName
	}
	c.wake.Volumes(changed)
	return runner.Result{}, nil
}

// resolvePod resolves the Pod's volumes. A volume that resolved before
// and now is pending, invalid or unsupported (PVC or PV deleted under a
// running Pod) keeps its earlier resolution: upstream's populator only adds volumes to a live
// Pod, and detaching a volume a container still uses would be worse than
// keeping it. Unsupported in-tree plugins get a Warning event, once per
// Pod volume.
func (c *Controller) resolvePod(ctx context.Context, pod *cachedPod, rec state.PodRecord) ([]volume.Attachable, []state.PodVolume, map[string]bool) {
	logger := klog.FromContext(ctx)
	results := c.resolver.ResolvePod(ctx, pod.asPod(), objects{c})
	var next []state.PodVolume
	warned := rec.Warned
	for i, r := range results {
		switch r.Status {
		case volume.StatusAttach:
			next = append(next, state.PodVolume{Name: r.PodVolume, Volume: r.Volume})
			continue
		case volume.StatusUnsupported:
			if !warned[r.PodVolume] {
				if warned == nil {
					warned = map[string]bool{}
				}
				warned[r.PodVolume] = true
				c.recorder.Event(podObject(pod.ref()), v1.EventTypeWarning, decide.ReasonFailedAttachVolume,
					decide.AttachFailedMessage(r.PodVolume, r.Message))
			}
		}
		// A volume that now needs no attach at all (its CSIDriver turned
		// attachRequired off, its plugin is no longer migrated) leaves the
		// desired state, as kcm's populator removes non-attachable volumes:
		// it is detached once the node no longer uses it.
		if prev, ok := rec.Volume(r.PodVolume); ok && r.Status != volume.StatusNoAttach {
			next = append(next, state.PodVolume{Name: r.PodVolume, Volume: prev})
			results[i] = volume.Result{PodVolume: r.PodVolume, Status: volume.StatusAttach, Volume: prev}
			logger.V(4).Info("Keeping the earlier resolution of a pod volume", "pod", klog.KRef(pod.namespace, pod.name), "volume", r.PodVolume, "status", r.Status, "reason", r.Message)
			continue
		}
		if r.Status != volume.StatusNoAttach {
			logger.V(4).Info("Pod volume is not attachable", "pod", klog.KRef(pod.namespace, pod.name), "volume", r.PodVolume, "status", r.Status, "reason", r.Message)
		}
	}
	return volume.Attachables(results), next, warned
}

// podObject is the minimal Pod an event needs to reference.
func podObject(p state.PodRef) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, UID: p.UID}}
}
