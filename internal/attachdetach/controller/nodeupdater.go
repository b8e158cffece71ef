package controller

import (
	"context"
	"fmt"
	"maps"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/attachdetach/nodestatus"
	"github.com/latchcsi/latch/internal/attachdetach/state"
	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/runner"
)

// syncNodeStatus makes node's status.volumesAttached what the actual
// state says, in one merge patch for however many volumes changed since
// the last pass (the queue coalesces). It runs on its own runner, so a
// slow or failing node write never holds up attaches and detaches of
// other nodes. After a write it wakes the node's detaching keys, which
// wait for the volume to leave the list before deleting their
// VolumeAttachment.
func (c *Controller) syncNodeStatus(ctx context.Context, name string) (runner.Result, error) {
	logger := klog.FromContext(ctx)
	node, err := c.nodeLister.Get(name)
	if apierrors.IsNotFound(err) {
		c.asw.NodeStatusGone(name)
		c.wake.Detaching(name)
		c.asw.ForgetNodeStatus(name)
		return runner.Result{}, nil
	}
	if err != nil {
		return runner.Result{}, fmt.Errorf("get node %s: %w", name, err)
	}
	c.asw.NodeStatusSeen(name)
	want := nodestatus.VolumesAttached(node.Status.VolumesAttached, c.asw.BeginNodeStatusWrite(name))
	last, wrote := c.asw.LastNodeStatusWrite(name)
	// The informer may not show our last write yet: then the server holds
	// what we wrote, and the informer's event for that write brings the
	// node back here. Otherwise the informer is the truth, which also
	// repairs a list another client changed.
	informerBehind := wrote && c.asw.NodeStatusInformerBehind(name, node.ResourceVersion)
	upToDate := !nodestatus.NeedsUpdate(node, want) && (!wrote || maps.Equal(last, state.VolumeSet(want)))
	if upToDate || informerBehind && maps.Equal(last, state.VolumeSet(want)) {
		if upToDate && !wrote {
			c.asw.FinishNodeStatusWrite(name, node.Status.VolumesAttached, true, node.ResourceVersion)
		} else {
			c.asw.FinishNodeStatusWrite(name, nil, false, "")
		}
		c.wake.Detaching(name)
		return runner.Result{}, nil
	}
	patch, err := nodestatus.MergePatch(want)
	if err != nil {
		c.asw.FinishNodeStatusWrite(name, nil, false, "")
		return runner.Result{}, err
	}
	updated, err := c.client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, patch,
		metav1.PatchOptions{FieldManager: kube.AttachDetachFieldManager}, "status")
	switch {
	case apierrors.IsNotFound(err):
		c.asw.FinishNodeStatusWrite(name, nil, false, "")
		c.asw.NodeStatusGone(name)
		c.wake.Detaching(name)
		return runner.Result{}, nil
	case err != nil:
		c.asw.FinishNodeStatusWrite(name, nil, false, "")
		return runner.Result{}, fmt.Errorf("update status.volumesAttached of node %s: %w", name, err)
	}
	c.asw.FinishNodeStatusWrite(name, updated.Status.VolumesAttached, true, updated.ResourceVersion)
	logger.V(2).Info("Updated node status", "node", klog.KObj(node), "volumesAttached", len(updated.Status.VolumesAttached))
	c.wake.Detaching(name)
	return runner.Result{}, nil
}
