package controller

import (
	"context"
	"crypto/sha256"

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
// informer cache every VerifyPeriod until ctx is done. It is a safety net
// for drift (a missed event, a VolumeAttachment created or deleted behind
// the controller's back), not the way work gets done: it reads memory
// (plus, rarely, our own creates and deletes the informer has not shown
// for a whole period, see verifyOwnWrites) and enqueues only the keys that disagree.
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
	// VolumeAttachment must still have one.
	var buf []byte
	for _, k := range c.asw.KeysAnyOrder() {
		driver, handle, err := kubenames.ParseUniqueVolumeName(string(k.Volume))
		if err != nil {
			continue
		}
		var d [sha256.Size]byte
		d, buf = kubenames.VolumeAttachmentDigest(buf, handle, driver, k.Node)
		if _, ok := listed[d]; !ok {
			drift++
			c.wake.Key(k)
		}
	}
	drift += c.verifyOwnWrites(ctx)
	klog.FromContext(ctx).V(3).Info("Verified the actual state against VolumeAttachments", "volumeAttachments", len(vas), "drift", drift, "duration", c.clock.Since(start))
}

// verifyOwnWrites checks the VolumeAttachments we created or deleted that
// the informer has not settled for a whole verify period
// (kube.OwnWrites.Unseen; normally there are none). A created one keeps
// its key waiting for the object; if the object was deleted while the
// watch was down (so the informer never saw it at all), nothing else
// would end the wait and the volume would never be attached. A deleted
// one counts as being deleted and blocks an exclusive volume's attach
// elsewhere until the informer reports it gone; if the informer missed
// its deletion too, only the API server can tell. An object the API
// server no longer has is forgotten and its key passes again (which
// creates it anew where it is wanted). One still there: the informer is
// only slow, or csi-attacher has not detached it yet. It returns how many
// it forgot.
func (c *Controller) verifyOwnWrites(ctx context.Context) int {
	drift := 0
	for _, uw := range c.vaCache.Unseen(c.clock.Now(), c.cfg.VerifyPeriod) {
		if !c.goneFromAPIServer(ctx, uw.Name, uw.UID) || !c.vaCache.ForgetUnseen(uw) {
			continue
		}
		drift++
		if !uw.Deleted {
			klog.FromContext(ctx).Info("VolumeAttachment created by the controller is gone without the informer showing it; attaching again", "volumeAttachment", klog.KRef("", uw.Name))
		}
		if key, ok := c.names.Get(uw.Name); ok {
			c.wake.Key(key)
		}
	}
	return drift
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
