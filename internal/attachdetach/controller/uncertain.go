package controller

import (
	"context"
	"fmt"

	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/attachdetach/state"
)

// settleUncertainCreate asks the API server about the VolumeAttachment
// name of key, whose create ended without a clear answer and which the
// informer does not show. An object the server has is overlaid as our own
// create (the informer may lag far behind) and returned; NotFound settles
// the uncertainty with nil. On a read error the outcome stays unknown and
// the error is returned: the caller's decision then sees "may exist",
// which keeps the key's attachment (and blocks an exclusive volume on
// every other node) instead of forgetting it.
//
// One case a read cannot rule out: a create the API server is still
// processing after our call gave up may be stored after the NotFound.
// The informer then shows it, and an object nothing wants is detached.
func (c *Controller) settleUncertainCreate(ctx context.Context, key state.Key, name string) (*storagev1.VolumeAttachment, error) {
	// CreateStarted/CreateDone bracket the read as they bracket a create:
	// if the informer reports the object deleted before the answer is
	// used, it is not overlaid.
	c.vaCache.CreateStarted(name)
	got, err := c.client.StorageV1().VolumeAttachments().Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		c.vaCache.CreateFailed(name)
		c.vaCache.CreateSettled(name)
		klog.FromContext(ctx).V(2).Info("VolumeAttachment create of unknown outcome did not store it", "volumeAttachment", klog.KRef("", name), "volume", key.Volume, "node", klog.KRef("", key.Node))
		return nil, nil
	case err != nil:
		c.vaCache.CreateFailed(name)
		return nil, fmt.Errorf("get VolumeAttachment %s for volume %s on node %s, whose create had an unknown outcome: %w", name, key.Volume, key.Node, err)
	}
	c.vaCache.CreateDone(name, got, c.clock.Now())
	c.vaCache.CreateSettled(name)
	klog.FromContext(ctx).Info("VolumeAttachment create of unknown outcome stored it", "volumeAttachment", klog.KObj(got), "volume", key.Volume, "node", klog.KRef("", key.Node))
	va, _, err := c.vaCache.Get(name)
	return va, err
}
