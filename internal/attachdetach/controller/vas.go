package controller

import (
	"context"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/attachdetach/decide"
	"github.com/latchcsi/latch/internal/attachdetach/state"
	"github.com/latchcsi/latch/internal/attachdetach/volume"
	"github.com/latchcsi/latch/internal/kube/kubenames"
	"github.com/latchcsi/latch/internal/runner"
)

// syncVA routes a VolumeAttachment the name book does not know to its
// (volume, node) key. Decisions about it are made by syncKey like for any
// other key; this only finds the key. A VolumeAttachment whose PV was
// deleted cannot be resolved through the PV; if no volume the controller
// or the node knows on its node hashes to its name, nothing can want it
// and nothing uses it, so it is deleted here (the gap in state.Rebuild:
// such VAs would otherwise stay forever).
func (c *Controller) syncVA(ctx context.Context, name string) (runner.Result, error) {
	logger := klog.FromContext(ctx)
	if key, ok := c.names.Get(name); ok {
		// Mostly the VolumeAttachments of the informer's initial list,
		// queued here before the rebuild registered their names.
		c.wake.KnownVolumeAttachment(key, c.settledAtStart(key))
		return runner.Result{}, nil
	}
	va, exists, err := c.vaCache.Get(name)
	if err != nil {
		return runner.Result{}, fmt.Errorf("get VolumeAttachment %s: %w", name, err)
	}
	if !exists {
		return runner.Result{}, nil
	}
	if node, err := listed(c.nodeLister.Get, va.Spec.NodeName); err == nil && node != nil && !decide.NodeFactsOf(node).Managed {
		// A node without the controller-managed annotation attaches its
		// own volumes (kubelet --enable-controller-attach-detach=false):
		// a VolumeAttachment there that the controller did not know is
		// its kubelet's, which may not list the volume in volumesInUse
		// yet. Adopting it would detach it under the Pod.
		// kube-controller-manager does not adopt them while running
		// either. (Those the controller knew when the node lost the
		// annotation are keys already, not handled here.)
		logger.V(2).Info("Leaving a VolumeAttachment on a node the controller does not manage to its kubelet", "volumeAttachment", klog.KObj(va), "node", klog.KObj(node))
		return runner.Result{}, nil
	}
	a, err := c.resolver.FromVolumeAttachment(ctx, va, objects{c})
	if err == nil {
		key := state.Key{Volume: a.UniqueName, Node: va.Spec.NodeName}
		if key.Node != "" && a.AttachmentName(key.Node) == name {
			c.adopt(ctx, name, key, a)
			return runner.Result{}, nil
		}
		// Not named the way the controller names VolumeAttachments (made
		// by hand or by another tool): not ours to manage.
		logger.V(2).Info("Ignoring VolumeAttachment with a foreign name", "volumeAttachment", klog.KObj(va), "expected", a.AttachmentName(key.Node))
		return runner.Result{}, nil
	}
	if !errors.Is(err, volume.ErrSourcePVNotFound) {
		return runner.Result{}, runner.Terminal(fmt.Errorf("resolve VolumeAttachment %s: %w", name, err))
	}
	if key, ok := c.matchName(name, va.Spec.NodeName); ok {
		driver, handle, err := kubenames.ParseUniqueVolumeName(string(key.Volume))
		if err != nil {
			return runner.Result{}, runner.Terminal(fmt.Errorf("VolumeAttachment %s: %w", name, err))
		}
		c.adopt(ctx, name, key, volume.NewAttachable(driver, handle))
		return runner.Result{}, nil
	}
	if va.DeletionTimestamp != nil {
		return runner.Result{}, nil
	}
	uid := va.UID
	err = c.client.StorageV1().VolumeAttachments().Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) {
		return runner.Result{}, fmt.Errorf("delete VolumeAttachment %s of deleted PV: %w", name, err)
	}
	c.vaCache.Deleted(name, uid, apierrors.IsNotFound(err), c.clock.Now())
	logger.Info("Deleted VolumeAttachment of a deleted PV that nothing wants", "volumeAttachment", klog.KObj(va), "node", klog.KRef("", va.Spec.NodeName))
	return runner.Result{}, nil
}

// adopt records a VolumeAttachment the actual state did not know as
// uncertain (detached if nothing wants it, confirmed if something does)
// and enqueues its volume.
func (c *Controller) adopt(ctx context.Context, name string, key state.Key, a volume.Attachable) {
	// Under the volume lock, as a key pass that may forget the name: see
	// state.Names.ForgetIf.
	defer c.volumeLocks.lock(key.Volume)()
	if c.asw.AddUncertain(a, key.Node) {
		klog.FromContext(ctx).V(2).Info("Adopted VolumeAttachment unknown to the actual state", "volumeAttachment", klog.KRef("", name), "volume", key.Volume, "node", klog.KRef("", key.Node))
	}
	c.names.Set(name, key)
	c.wake.Volumes([]state.Key{key})
}
