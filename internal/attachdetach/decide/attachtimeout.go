package decide

import (
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/latchcsi/latch/internal/attachdetach/state"
)

// kube-controller-manager's CSI attacher creates a VolumeAttachment and
// then waits for it to be attached; after csiTimeout (2 minutes, a
// constant in pkg/volume/csi, not a flag) the attach fails with "timed out
// waiting for external-attacher of <driver> CSI driver to attach volume
// <handle>", recorded on each Pod as FailedAttachVolume. The reconciler
// retries the failed operation after an exponential backoff (500 ms,
// doubling, at most 2 m 2 s: goroutinemap/exponentialbackoff), and the
// retry waits 2 minutes again. So a VolumeAttachment that no attacher
// serves gets that event 2 minutes after the attach started, and again
// every 2 minutes plus the growing backoff. latch waits on the informer
// instead of in a blocked operation, and reports the same events at the
// same times.
const (
	// AttachTimeout is kube-controller-manager's csiTimeout.
	AttachTimeout = 2 * time.Minute
	// attachRetryInitial and attachRetryMax are the bounds of its retry
	// backoff after a failed attach.
	attachRetryInitial = 500 * time.Millisecond
	attachRetryMax     = 2*time.Minute + 2*time.Second
)

// AttachTimeoutMessage is the FailedAttachVolume text of an attach that
// timed out: "AttachVolume.Attach failed for volume "<spec>" : timed out
// waiting for external-attacher of <driver> CSI driver to attach volume
// <handle>".
func AttachTimeoutMessage(specName, driver, handle string) string {
	return AttachFailedMessage(specName, fmt.Sprintf("timed out waiting for external-attacher of %s CSI driver to attach volume %s", driver, handle))
}

// AttachTimeouts returns how many of kube-controller-manager's attach
// attempts that started at since have timed out by now, and when the next
// one times out. since is the start of the first attempt; attempt n+1
// starts the backoff after attempt n timed out.
func AttachTimeouts(since, now time.Time) (n int, next time.Time) {
	next = since.Add(AttachTimeout)
	backoff := attachRetryInitial
	for !now.Before(next) {
		n++
		next = next.Add(backoff + AttachTimeout)
		backoff = min(2*backoff, attachRetryMax)
	}
	return n, next
}

// attachTimeoutPlan adds to p, a wait for the attacher, the events of the
// attach timeouts that passed since in.AttachWaitSince and a timer for the
// next one. A zero AttachWaitSince is a wait that starts now.
func attachTimeoutPlan(in Input, p *Plan) {
	since := in.AttachWaitSince
	if since.IsZero() {
		since = in.Now
	}
	n, next := AttachTimeouts(since, in.Now)
	p.AttachTimeouts = n
	p.RequeueAfter = next.Sub(in.Now)
	if n == 0 {
		return
	}
	w := in.Wanted.Volume
	msg := AttachTimeoutMessage(w.SpecName, w.Driver, w.VolumeHandle)
	// One event per timeout, as each of upstream's failed attempts
	// records one; an event recorder folds repeats into a count.
	key := fmt.Sprintf("attach-timeout/%s/%s/%d", in.Key, since.UTC().Format(time.RFC3339Nano), n)
	p.Events = podEvents(in, v1.EventTypeWarning, ReasonFailedAttachVolume, key, func(state.PodRef) string { return msg })
}
