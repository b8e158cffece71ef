package controller

import (
	"context"
	"errors"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/attachdetach/state"
	"github.com/latchcsi/latch/internal/attachdetach/volume"
	"github.com/latchcsi/latch/internal/kube/kubenames"
)

func everything() labels.Selector { return labels.Everything() }

// rebuild fills the actual and desired state from the synced caches
// before any worker runs, in upstream's order: Node statuses (what the
// kubelets were told is attached, what they use), then VolumeAttachments
// (uncertain unless the node status explained them), then Pods. Every key
// is enqueued once; from then on only changes enqueue keys. The keys that
// look settled (settledAtStart) wait in the key queue's low lane, so that
// a change right after the start does not wait behind every volume of
// the cluster.
//
// Every Pod is recorded here, synchronously, not handed to the Pod queue:
// the key workers start together with the Pod workers, and a key decided
// before the Pods that want it are recorded looks unwanted, so a restart
// or a new leader would delete a VolumeAttachment that is still
// attaching (and re-create it a moment later) and drop an attached volume
// the kubelet is about to mount from the node status.
// kube-controller-manager's desired state populator fills its desired
// state the same way before its reconciler runs.
func (c *Controller) rebuild(ctx context.Context) {
	logger := klog.FromContext(ctx)
	nodes, _ := c.nodeLister.List(everything())
	for _, node := range nodes {
		_, managed := node.Annotations[kubenames.ControllerManagedAttachAnnotation]
		c.dsw.AddNode(node.Name, managed)
		if _, err := c.asw.AddFromNode(node); err != nil {
			logger.V(2).Info("Skipping node status entries that are not CSI volumes", "node", klog.KObj(node), "err", err)
		}
	}
	vas := c.vaCache.List()
	_, err := c.asw.AddFromVolumeAttachments(ctx, vas, c.resolver, objects{c})
	if err != nil {
		// VolumeAttachments whose PV is gone cannot be keyed here; the VA
		// queue matches them against node statuses or deletes them.
		if errors.Is(err, volume.ErrSourcePVNotFound) {
			logger.Info("Some VolumeAttachments reference deleted PVs; resolving them separately", "err", err)
		} else {
			logger.Error(err, "Some VolumeAttachments could not be added to the actual state")
		}
	}
	pods := c.listPods()
	recorded := c.recordPods(ctx, pods)
	c.rebuilt.Store(true)
	keys := c.asw.Keys()
	for _, k := range keys {
		c.register(k)
		c.wake.Key(k)
	}
	// A VolumeAttachment whose name is now registered is one of the keys
	// above (its pass in the VolumeAttachment queue would only wake that
	// key again, out of the low lane); the others go to the queue that
	// resolves them.
	for _, va := range vas {
		if _, known := c.names.Get(va.Name); !known {
			c.wake.UnknownVolumeAttachment(va.Name)
		}
	}
	for _, node := range nodes {
		c.wake.NodeStatus(node.Name)
	}
	c.wake.releaseHeld()
	urgent, settled := c.wake.releaseKeys(c.settledAtStart)
	logger.Info("Rebuilt the actual state of the world", "nodes", len(nodes), "volumeAttachments", len(vas), "attachments", len(keys), "pods", len(pods), "podsRecorded", recorded,
		"keysToCheckFirst", urgent, "keysSettled", settled)
}

// settledAtStart says key looks as it should at start: attached, in its
// node's status, wanted by a Pod and not being detached. Its pass most
// likely finds nothing to do; it still runs, after the keys that may need
// work.
func (c *Controller) settledAtStart(k state.Key) bool {
	a, ok := c.asw.Get(k)
	if !ok || a.State != state.StateAttached || !a.ReportedInNodeStatus || !a.DetachRequestedAt.IsZero() {
		return false
	}
	_, wanted := c.dsw.Get(k)
	return wanted
}

// recordPods records the scheduled Pods in the desired state, as the Pod
// queue would, and returns how many it recorded. The Pod queue only gets a
// Pod whose pass failed, to retry it with backoff; the keys of the
// recorded Pods' volumes are in the key queue, which no worker drains yet.
func (c *Controller) recordPods(ctx context.Context, pods []*cachedPod) int {
	logger := klog.FromContext(ctx)
	recorded := 0
	for _, pod := range pods {
		if pod.nodeName == "" {
			continue
		}
		key := state.PodKey(pod.namespace, pod.name)
		c.wake.PodRecorded(key)
		if _, err := c.syncPod(ctx, key); err != nil {
			logger.Error(err, "Could not record the Pod's volumes at start; retrying", "pod", klog.KRef(pod.namespace, pod.name))
			c.wake.Pod(pod.namespace, pod.name)
			continue
		}
		recorded++
	}
	return recorded
}

// register records the VolumeAttachment name of key.
func (c *Controller) register(key state.Key) {
	if name, err := volume.AttachmentNameFor(key.Volume, key.Node); err == nil {
		c.names.Set(name, key)
	}
}

// matchName finds the volume on node whose VolumeAttachment is called
// name among the volumes the controller knows there (actual and desired
// state) and the node's status lists. It costs one hash per volume of the
// node and is only used for VolumeAttachments whose PV is gone.
func (c *Controller) matchName(name, node string) (state.Key, bool) {
	var candidates []v1.UniqueVolumeName
	for _, e := range c.asw.ForNode(node) {
		candidates = append(candidates, e.Volume)
	}
	for _, w := range c.dsw.VolumesOnNode(node) {
		candidates = append(candidates, w.Volume.UniqueName)
	}
	if n, err := c.nodeLister.Get(node); err == nil {
		candidates = append(candidates, n.Status.VolumesInUse...)
		for _, av := range n.Status.VolumesAttached {
			candidates = append(candidates, av.Name)
		}
	}
	for _, vol := range candidates {
		if got, err := volume.AttachmentNameFor(vol, node); err == nil && got == name {
			return state.Key{Volume: vol, Node: node}, true
		}
	}
	return state.Key{}, false
}
