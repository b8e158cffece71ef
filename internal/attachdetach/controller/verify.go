package controller

import (
	"context"
	"crypto/sha256"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/attachdetach/decide"
	"github.com/latchcsi/latch/internal/attachdetach/state"
	"github.com/latchcsi/latch/internal/kube/kubenames"
	"github.com/latchcsi/latch/internal/runner"
)

// runVerify compares the actual state with the VolumeAttachments in the
// informer cache and with the desired state every VerifyPeriod until ctx
// is done. It is a safety net for drift (a missed event, a
// VolumeAttachment created or deleted behind the controller's back) and
// for lost wake-ups, not the way work gets done: it reads memory only and
// enqueues only the keys that disagree or are not settled: a key wanted
// without an actual state entry (waiting for another node, or never
// woken), and an entry nothing wants (waiting for its unmount, or never
// woken). A settled cluster wakes nothing.
func (c *Controller) runVerify(ctx context.Context) {
	runner.Every(ctx, c.clock, c.cfg.VerifyPeriod, c.verify)
}

func (c *Controller) verify(ctx context.Context) {
	start := c.clock.Now()
	drift := 0
	// Every VolumeAttachment must be known to the actual state.
	vas := c.vaCache.List()
	// The listed names of the controller's form, as the digests they
	// spell: the names the second loop looks for all have that form, and
	// comparing digests lets it look without building each name (the
	// pass runs over every attached volume once a period, and at rest it
	// is most of what the controller does).
	listed := make(map[[sha256.Size]byte]struct{}, len(vas))
	for _, va := range vas {
		var key state.Key
		var indexed bool
		if d, ours := kubenames.VolumeAttachmentNameDigest(va.Name); ours {
			listed[d] = struct{}{}
			key, indexed = c.names.GetDigest(d) // the name is parsed once
		} else {
			key, indexed = c.names.Get(va.Name)
		}
		if !indexed {
			drift++
			c.wake.UnknownVolumeAttachment(va.Name)
			continue
		}
		st, known := c.asw.StateOf(key)
		facts := decide.VAFactsOf(va)
		if !known || facts.Attached != (st == state.StateAttached) && !facts.Deleting {
			drift++
			c.wake.Key(key)
		}
	}
	// Every actual state entry the controller believes has a
	// VolumeAttachment must still have one. One nothing wants is on its
	// way to a detach (its node still uses it, or a wake-up was lost).
	unsettled := 0
	var buf []byte
	for _, k := range c.asw.KeysAnyOrder() {
		driver, handle, err := kubenames.ParseUniqueVolumeName(string(k.Volume))
		if err != nil {
			continue
		}
		var d [sha256.Size]byte
		d, buf = kubenames.VolumeAttachmentDigest(buf, handle, driver, k.Node)
		switch _, ok := listed[d]; {
		case !ok:
			drift++
			c.wake.Key(k)
		case !c.dsw.Wants(k):
			unsettled++
			c.wake.Key(k)
		}
	}
	// Every wanted key the actual state has no entry of waits (for
	// another node to let an exclusive volume go, for its node's
	// migration) or was never woken: its pass creates the
	// VolumeAttachment, or says again why it waits. Without this, a
	// wake-up lost on the way to such a key would leave its Pod waiting
	// forever, since no VolumeAttachment and no actual state entry of it
	// exists for the loops above to find.
	for _, k := range c.dsw.KeysAnyOrder() {
		if _, known := c.asw.StateOf(k); !known {
			unsettled++
			c.wake.Key(k)
		}
	}
	klog.FromContext(ctx).V(3).Info("Verified the actual state against VolumeAttachments and the desired state", "volumeAttachments", len(vas), "drift", drift, "unsettled", unsettled, "duration", c.clock.Since(start))
}

// runUnseenWriteCheck runs checkUnseenWrites every UnseenWriteCheck until
// ctx is done, whether or not the verify pass runs: without it a key can
// wait forever (see checkUnseenWrites).
func (c *Controller) runUnseenWriteCheck(ctx context.Context) {
	runner.Every(ctx, c.clock, c.cfg.UnseenWriteCheck, func(ctx context.Context) { c.checkUnseenWrites(ctx, c.cfg.UnseenWriteCheck) })
}

// checkUnseenWrites checks the VolumeAttachments we created or deleted
// that the informer has not settled for longer than age
// (kube.OwnWrites.Unseen; normally there are none, and the check reads
// only that list). A created one keeps its key waiting for the object; a
// deleted one counts as being deleted (it blocks an exclusive volume's
// attach everywhere, its own node included) until the informer reports
// it gone. If the object was created, or deleted, while the informer's
// watch was down (an API server restart), and was gone before the
// informer listed again, the informer never shows it at all and nothing
// else would end the wait: the volume would never be attached again.
// Only the API server can tell: an object it no longer has is forgotten
// and its key passes again (which creates it anew where it is wanted).
// One still there: the informer is only slow, or csi-attacher has not
// detached it yet; it is asked again at the next check. It returns how
// many it forgot.
func (c *Controller) checkUnseenWrites(ctx context.Context, age time.Duration) int {
	logger := klog.FromContext(ctx)
	forgot := 0
	unseen := c.vaCache.Unseen(c.clock.Now(), age)
	for _, uw := range unseen {
		if !c.goneFromAPIServer(ctx, uw.Name, uw.UID) || !c.vaCache.ForgetUnseen(uw) {
			continue
		}
		forgot++
		if uw.Deleted {
			logger.Info("VolumeAttachment deleted by the controller is gone without the informer showing it; attaching wherever it is wanted", "volumeAttachment", klog.KRef("", uw.Name))
		} else {
			logger.Info("VolumeAttachment created by the controller is gone without the informer showing it; attaching again", "volumeAttachment", klog.KRef("", uw.Name))
		}
		if key, ok := c.names.Get(uw.Name); ok {
			c.wake.Key(key)
		}
	}
	if len(unseen) > 0 {
		logger.V(2).Info("Checked own VolumeAttachment writes the informer has not shown", "unseen", len(unseen), "gone", forgot)
	}
	return forgot
}

// goneFromAPIServer reports whether the API server no longer has the
// VolumeAttachment name with that uid (another object of the name counts
// as gone). A read error counts as "not known to be gone".
func (c *Controller) goneFromAPIServer(ctx context.Context, name string, uid types.UID) bool {
	va, err := c.client.StorageV1().VolumeAttachments().Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return true
	case err != nil:
		klog.FromContext(ctx).V(2).Info("Cannot check a VolumeAttachment the informer has not shown", "volumeAttachment", klog.KRef("", name), "err", err)
		return false
	default:
		return va.UID != uid
	}
}
