package controller

import (
	"context"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/attachdetach/decide"
	"github.com/latchcsi/latch/internal/attachdetach/state"
)

// createFailed reports a create of the VolumeAttachment of key that failed
// with err (AlreadyExists is no failure): a Warning FailedAttachVolume
// event with kube-controller-manager's text on each Pod that wants the
// volume there (decide.CreateFailedEvents, every attempt, as kcm; the
// key's retry backoff bounds them), the create error counter by the
// API server's reason, and the attempt as a failed volume_attach in
// storage_operation_duration_seconds, as kcm counts a failed attach.
// Without it a create that an admission policy refuses is retried forever
// with nothing but the controller's log saying why.
func (c *Controller) createFailed(ctx context.Context, key state.Key, err error) {
	reason := string(apierrors.ReasonForError(err))
	if reason == "" {
		reason = "Unknown"
	}
	c.metrics.createErrors.WithLabelValues(driverOf(key.Volume), reason).Inc()
	c.timing.attachFailed(key, c.clock.Now(), c.metrics)
	w, ok := c.dsw.Get(key)
	if !ok {
		return
	}
	klog.FromContext(ctx).V(2).Info("Reporting a failed VolumeAttachment create to the Pods", "volume", key.Volume, "node", klog.KRef("", key.Node), "pods", len(w.Pods), "reason", reason)
	for _, ev := range decide.CreateFailedEvents(key, w, err.Error()) {
		c.recorder.Event(podObject(ev.Pod), ev.Type, ev.Reason, ev.Message)
	}
}
