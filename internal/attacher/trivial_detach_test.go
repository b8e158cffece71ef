package attacher

import (
	"slices"
	"strings"
	"testing"

	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// A VolumeAttachment attached while the driver had PUBLISH_UNPUBLISH_VOLUME
// carries our finalizer. After the driver is replaced by one without that
// capability, csi-attacher runs the trivial handler: ControllerUnpublish
// cannot be called, so the finalizer stays (the volume may still be
// published), and the VA says why in status.detachError and one Warning
// DetachFailed event (decide.ReasonUnpublishUnsupported), with no driver
// call.
func TestTrivialModeDeletingVAWithOurFinalizerKeepsItAndSaysWhyInDetachErrorAndOneEvent(t *testing.T) {
	f := newExecFixture(t, execPV("pv-a"), deleting(attachedVA("va-a", "pv-a")), execCSINode())
	f.ctrl.cfg.Trivial = true
	for range 3 {
		_, _ = f.ctrl.syncDetach(f.ctx, "va-a")
	}
	va := f.va("va-a")
	events := drainEvents(f.recorder)
	if slices.Contains(va.Finalizers, kubenames.AttacherFinalizer(execDriver)) && va.Status.DetachError == nil && !strings.Contains(strings.Join(events, "\n"), EventDetachFailed) {
		t.Errorf("deleting VA keeps our finalizer %v forever with no detachError and no event (events %q)", va.Finalizers, events)
	}
	if !slices.Contains(va.Finalizers, kubenames.AttacherFinalizer(execDriver)) {
		t.Errorf("finalizers = %v: our finalizer removed although nothing unpublished the volume", va.Finalizers)
	}
	if va.Status.DetachError == nil || !strings.Contains(va.Status.DetachError.Message, "PUBLISH_UNPUBLISH_VOLUME") || !strings.Contains(va.Status.DetachError.Message, "node-1-id") {
		t.Errorf("detachError = %+v, want one naming the missing capability and the node ID", va.Status.DetachError)
	}
	if len(events) != 1 || !strings.HasPrefix(events[0], "Warning "+EventDetachFailed) {
		t.Errorf("events = %q, want one Warning %s over three passes", events, EventDetachFailed)
	}
	f.requireCSICalls()
}
