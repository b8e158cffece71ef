package attacher

import (
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// A publication orphaned by a force-deleted VolumeAttachment is still on
// the node (its unpublish keeps failing). The PV is deleted meanwhile; the
// PV queue finds no VolumeAttachment referring to it, but the pending
// orphan holds the PV (decide.OrphanHoldsPV): our PV finalizer stays, so
// the provisioner's DeleteVolume does not run on a published volume.
func TestPVFinalizerKeptWhileOrphanedPublicationIsStillPublished(t *testing.T) {
	pv := execPV("pv-a")
	pv.Finalizers = []string{kubenames.PVFinalizer(execDriver)}
	f := newExecFixture(t, pv, execVA("va-a", "pv-a"), execCSINode())
	withStore(f)
	deleteOnStatusPatch(f, "va-a")
	if _, err := f.driver.AddFault(csimock.Rule{Method: "ControllerUnpublishVolume", Code: codes.Unavailable, Message: "backend busy"}); err != nil {
		t.Fatal(err)
	}
	_, _ = f.ctrl.syncAttach(f.ctx, "va-a")
	if _, ok := f.ctrl.orphanSnapshot()["va-a"]; !ok {
		t.Fatalf("no pending orphan: %v", f.ctrl.orphanSnapshot())
	}
	f.waitFor("VA gone from the cache", func() bool { _, exists, _ := f.vaStore.GetByKey("va-a"); return !exists })

	// The PV is deleted (our finalizer keeps it).
	cur := f.pv("pv-a").DeepCopy()
	now := metav1.Now()
	cur.DeletionTimestamp = &now
	if err := f.tracker.Update(pvGVR, cur, ""); err != nil {
		t.Fatal(err)
	}
	f.waitFor("deleting PV in the cache", func() bool {
		p, _ := LookupPV(f.pvStore, "pv-a")
		return p != nil && p.DeletionTimestamp != nil
	})
	_, _ = f.ctrl.syncPV(f.ctx, "pv-a")

	published := f.driver.Published("handle-pv-a")
	got := f.pv("pv-a")
	if len(published) > 0 && !slices.Contains(got.Finalizers, kubenames.PVFinalizer(execDriver)) {
		t.Errorf("PV finalizer removed (finalizers %v) while the volume is still published to %v by a pending orphan %v",
			got.Finalizers, published, f.ctrl.orphanSnapshot())
	}
}
