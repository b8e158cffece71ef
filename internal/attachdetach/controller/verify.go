package controller

import (
	"context"

	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/attachdetach/decide"
	"github.com/latchcsi/latch/internal/attachdetach/state"
	"github.com/latchcsi/latch/internal/attachdetach/volume"
)

// runVerify compares the actual state with the VolumeAttachments in the
// informer cache every VerifyPeriod until ctx is done. It is a safety net
// for drift (a missed event, a VolumeAttachment created or deleted behind
// the controller's back), not the way work gets done: it reads only
// memory and enqueues only the keys that disagree.
func (c *Controller) runVerify(ctx context.Context) {
	t := c.clock.NewTicker(c.cfg.VerifyPeriod)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			c.verify(ctx)
		}
	}
}

func (c *Controller) verify(ctx context.Context) {
	start := c.clock.Now()
	drift := 0
	// Every VolumeAttachment must be known to the actual state.
	vas, _ := c.vaLister.List(everything())
	for _, va := range vas {
		key, ok := c.names.get(va.Name)
		if !ok {
			drift++
			c.vaQueue.Enqueue(va.Name)
			continue
		}
		e, known := c.asw.Get(key)
		facts := decide.VAFactsOf(va)
		if !known || facts.Attached != (e.State == state.StateAttached) && !facts.Deleting {
			drift++
			c.keys.Enqueue(key)
		}
	}
	// Every actual state entry the controller believes has a
	// VolumeAttachment must still have one.
	for _, k := range c.asw.Keys() {
		name, err := volume.AttachmentNameFor(k.Volume, k.Node)
		if err != nil {
			continue
		}
		if _, err := c.vaLister.Get(name); err != nil {
			drift++
			c.keys.Enqueue(k)
		}
	}
	klog.FromContext(ctx).V(3).Info("Verified the actual state against VolumeAttachments", "volumeAttachments", len(vas), "drift", drift, "duration", c.clock.Since(start))
}
