package attacher

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// The VolumeAttachment va-r, attached, is deleted and made again under the
// same name while a ListVolumes listing is under way, and the new object
// is attached too, its publish after the driver's listing was taken. The
// listing, which lists neither, judged the old object: the new one is not
// marked detached, and its next pass publishes nothing.
func TestListVolumesRepairLeavesAVolumeAttachmentMadeAgainDuringTheListingAlone(t *testing.T) {
	pv := execPV("pv-r")
	pv.Finalizers = []string{kubenames.PVFinalizer(execDriver)}
	f := newExecFixture(t, pv, attachedVA("va-r", "pv-r"), execCSINode())
	f.ctrl.exec.csi = &listingHookCSI{CSIClient: f.ctrl.exec.csi, during: func() {
		if err := f.tracker.Delete(vaGVR, "", "va-r"); err != nil {
			t.Fatal(err)
		}
		again := attachedVA("va-r", "pv-r")
		again.UID = "uid-va-r-again"
		if err := f.tracker.Create(vaGVR, again, ""); err != nil {
			t.Fatal(err)
		}
		f.waitFor("the new va-r in the cache", func() bool {
			va, err := f.ctrl.getVA("va-r")
			return err == nil && va != nil && va.UID == types.UID("uid-va-r-again")
		})
	}}

	if err := f.ctrl.reconcileOnce(f.ctx); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	f.requireWrites()
	if got := f.va("va-r"); !got.Status.Attached || got.UID != "uid-va-r-again" {
		t.Fatalf("va-r after the reconcile: uid %s attached=%v, want the new object still attached", got.UID, got.Status.Attached)
	}
	if _, err := f.ctrl.syncAttach(f.ctx, "va-r"); err != nil {
		t.Fatalf("syncAttach: %v", err)
	}
	f.requireCSICalls()
	f.requireWrites()
}

// The ListVolumes reconcile judges VAs as they were before the listing.
// One that was deleted meanwhile (and so is no longer published) is not
// "lost": it must not be marked detached or queued for a publish.
func TestReconcileDoesNotRepublishAVolumeAttachmentDeletedDuringTheListing(t *testing.T) {
	f := newExecFixture(t, execPV("pv-r"), attachedVA("va-r", "pv-r"), execCSINode())
	f.ctrl.cfg.ReconcileTimeout = 10 * time.Second
	if _, err := f.driver.AddFault(csimock.Rule{Method: "ListVolumes", Latency: 300 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- f.ctrl.reconcileOnce(f.ctx) }()
	f.waitFor("the listing in flight", func() bool { return len(f.driver.CallsTo("ListVolumes")) == 1 })
	f.updateVA(deleting(f.va("va-r")))
	f.client.ClearActions()
	if err := <-done; err != nil {
		t.Fatalf("reconcileOnce: %v", err)
	}
	f.requireWrites()
	if va := f.va("va-r"); !va.Status.Attached {
		t.Errorf("VA status = %+v, want still attached (its detach will clear it)", va.Status)
	}
}
