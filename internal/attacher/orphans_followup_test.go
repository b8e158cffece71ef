package attacher

import (
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/latchcsi/latch/internal/csimock"
)

// A ControllerPublish that fails with a final code published nothing: when
// its VolumeAttachment is gone by the time attachError is written, no
// orphan is made and nothing is unpublished or recorded.
func TestPublishFinalErrorForGoneVolumeAttachmentIsNoOrphan(t *testing.T) {
	for _, code := range []codes.Code{codes.InvalidArgument, codes.NotFound, codes.FailedPrecondition, codes.Internal} {
		t.Run(code.String(), func(t *testing.T) {
			f := newExecFixture(t, execPV("pv-a"), execVA("va-a", "pv-a"), execCSINode())
			store := withStore(f)
			deleteOnStatusPatch(f, "va-a")
			if _, err := f.driver.AddFault(csimock.Rule{Method: "ControllerPublishVolume", Once: true, Code: code, Message: "refused"}); err != nil {
				t.Fatal(err)
			}
			_, err := f.ctrl.syncAttach(f.ctx, "va-a")
			if !apierrors.IsNotFound(err) {
				t.Fatalf("syncAttach = %v, want the NotFound of the attachError write", err)
			}
			f.requireCSICalls("ControllerPublishVolume handle-pv-a node-1-id " + code.String())
			if got := f.ctrl.orphanSnapshot(); len(got) != 0 {
				t.Errorf("orphans = %v, want none after a final publish error", got)
			}
			if ops := store.operations(); len(ops) != 0 {
				t.Errorf("record operations = %v, want none", ops)
			}
			if events := strings.Join(drainEvents(f.recorder), "\n"); strings.Contains(events, EventOrphanedPublication) {
				t.Errorf("events = %q, want no %s", events, EventOrphanedPublication)
			}
		})
	}
}

// A publish of unknown outcome (it took effect, the answer was Unavailable)
// whose VolumeAttachment already shows the same attachError: recordError
// writes nothing, so nothing carries the UID; a live read finds the object
// gone and the possible publication is undone.
func TestPublishUnknownOutcomeWithUnchangedAttachErrorDetectsGoneVolumeAttachment(t *testing.T) {
	for i := range 5 {
		f := newExecFixture(t, execPV("pv-a"), execVA("va-a", "pv-a"), execCSINode())
		store := withStore(f)
		// First pass: nothing published, attachError written.
		if _, err := f.driver.AddFault(csimock.Rule{Method: "ControllerPublishVolume", Once: true, Code: codes.Unavailable, Message: "backend busy"}); err != nil {
			t.Fatal(err)
		}
		if _, err := f.ctrl.syncAttach(f.ctx, "va-a"); err == nil {
			t.Fatalf("iteration %d: first syncAttach succeeded, want the Unavailable", i)
		}
		first := f.va("va-a").Status.AttachError
		if first == nil {
			t.Fatalf("iteration %d: no attachError after the first pass", i)
		}
		// Second pass: the publish takes effect, answers the same error
		// late, and the VolumeAttachment is deleted meanwhile.
		if _, err := f.driver.AddFault(csimock.Rule{Method: "ControllerPublishVolume", Once: true, Phase: csimock.PhaseAfter,
			Latency: 300 * time.Millisecond, Code: codes.Unavailable, Message: "backend busy"}); err != nil {
			t.Fatal(err)
		}
		go func() {
			for len(f.driver.Published("handle-pv-a")) == 0 && f.ctx.Err() == nil {
				time.Sleep(2 * time.Millisecond)
			}
			_ = f.tracker.Delete(vaGVR, "", "va-a")
		}()
		if _, err := f.ctrl.syncAttach(f.ctx, "va-a"); err != nil {
			t.Fatalf("iteration %d: second syncAttach: %v, want the orphan unpublished", i, err)
		}
		f.requireCSICalls(
			"ControllerPublishVolume handle-pv-a node-1-id Unavailable",
			"ControllerPublishVolume handle-pv-a node-1-id Unavailable",
			"ControllerUnpublishVolume handle-pv-a node-1-id OK")
		if got := f.driver.Published("handle-pv-a"); len(got) != 0 {
			t.Errorf("iteration %d: still published to %v", i, got)
		}
		if got := store.operations(); !slices.Equal(got, []string{"put va-a", "delete va-a"}) {
			t.Errorf("iteration %d: record operations = %v, want [put va-a delete va-a]", i, got)
		}
		events := strings.Join(drainEvents(f.recorder), "\n")
		if !strings.Contains(events, EventOrphanedPublication) || !strings.Contains(events, "may have been published") {
			t.Errorf("iteration %d: events = %q, want %s saying the volume may have been published", i, events, EventOrphanedPublication)
		}
	}
}
