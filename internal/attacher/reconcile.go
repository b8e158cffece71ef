package attacher

import (
	"context"
	"errors"
	"fmt"
	"slices"

	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/attacher/decide"
	"github.com/latchcsi/latch/internal/csi"
	"github.com/latchcsi/latch/internal/kube/kubenames"
	"github.com/latchcsi/latch/internal/runner"
)

// runReconciler compares the driver's view (ListVolumes with published
// nodes) with the VolumeAttachments every ReconcileSync until ctx is done.
func (c *Controller) runReconciler(ctx context.Context) {
	logger := klog.FromContext(ctx).WithName("listvolumes-reconciler")
	ctx = klog.NewContext(ctx, logger)
	runner.Every(ctx, c.clock, c.cfg.ReconcileSync, func(ctx context.Context) {
		if err := c.reconcileOnce(ctx); err != nil {
			logger.Error(err, "ListVolumes reconcile failed; next try at the next period")
		}
	})
}

func (c *Controller) reconcileOnce(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	var before []*storagev1.VolumeAttachment
	for _, va := range c.vaCache.List() {
		// (Other attachers' VAs are ForeignVA placeholders, left out.)
		if va.Spec.Attacher == c.cfg.Driver.Name {
			before = append(before, va)
		}
	}
	orphans := c.orphanSnapshot()
	published, err := c.exec.listVolumes(ctx, c.cfg.ReconcileTimeout, c.cfg.MaxEntries)
	if err != nil {
		var aborted *csi.ListVolumesAbortedError
		if errors.As(err, &aborted) {
			c.exec.metrics.listVolumesAborted(aborted.Reason)
		}
		return fmt.Errorf("ListVolumes reconcile of driver %q: %w", c.cfg.Driver.Name, err)
	}
	c.dropUnlisted(ctx, orphans, published)
	marked := map[string]types.UID{}
	for _, r := range decide.Repairs(before, published, c.cfg.Driver.Name) {
		va, err := c.getVA(r.VA)
		if err != nil || va == nil || va.UID != r.UID {
			// Gone, or re-created under the same name during the listing:
			// the listing may predate the new object's publish, so it
			// says nothing about it (the next listing judges it).
			continue
		}
		// The VA may have moved on during the listing (a delete, a
		// detach): repair only what its current state still calls for.
		if decide.RepairFor(va, r.Action == "unpublish", c.cfg.Driver.Name) != r.Action {
			continue
		}
		logger.Info("VolumeAttachment out of sync with the driver", "volumeAttachment", klog.KObj(va), "action", r.Action)
		c.exec.metrics.repaired(r.Action)
		switch r.Action {
		case "republish":
			// Marking it detached makes the attach queue publish again.
			status := *va.Status.DeepCopy()
			status.Attached = false
			if err := c.exec.writeStatus(ctx, va, status); err != nil {
				logger.Error(err, "Mark VolumeAttachment for re-publish", "volumeAttachment", klog.KObj(va))
				continue
			}
			c.attach.ForgetAndEnqueue(va.Name)
		case "unpublish":
			if !slices.Contains(va.Finalizers, kubenames.AttacherFinalizer(c.cfg.Driver.Name)) {
				// No detach of ours is coming for it: tell the detach pass.
				marked[va.Name] = va.UID
			}
			c.detach.ForgetAndEnqueue(va.Name)
		}
	}
	c.orphans.setStillPublished(marked)
	return nil
}
