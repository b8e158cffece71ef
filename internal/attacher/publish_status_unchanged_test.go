package attacher

import (
	"context"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/latchcsi/latch/internal/csi"
	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// duringPublishCSI runs during its first ControllerPublish, after the
// driver published, and answers the publish context pc.
type duringPublishCSI struct {
	CSIClient
	pc     map[string]string
	during func()
}

func (d *duringPublishCSI) ControllerPublish(ctx context.Context, req csi.PublishRequest) (map[string]string, error) {
	if _, err := d.CSIClient.ControllerPublish(ctx, req); err != nil {
		return nil, err
	}
	if d.during != nil {
		during := d.during
		d.during = nil
		during()
	}
	return d.pc, nil
}

// A VolumeAttachment shows attached=true with the very publish context the
// driver answers, but lacks our finalizer (another client removed it), so
// latch does not believe it and publishes. While the driver publishes,
// another client strips our finalizer again and deletes the VA, or deletes
// it and creates a new VA of the same name for another volume. The status
// is unchanged, so no status write (and no UID precondition) tells that
// the VA is gone: a live read does, and the publication is an orphan,
// unpublished.
func TestPublishWhoseStatusIsUnchangedForAVAGoneMeanwhileIsUnpublished(t *testing.T) {
	for _, tc := range []struct {
		name     string
		replaced bool
	}{
		{name: "force-deleted"},
		{name: "replaced by a VA for another volume", replaced: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			va := attachedVA("va-a", "pv-a")
			va.Finalizers = nil
			f := newExecFixture(t, execPV("pv-a"), execPV("pv-b"), va, execCSINode())
			store := withStore(f)
			f.ctrl.exec.csi = &duringPublishCSI{CSIClient: f.ctrl.exec.csi, pc: va.Status.AttachmentMetadata, during: func() {
				if err := f.tracker.Delete(vaGVR, "", "va-a"); err != nil {
					t.Error(err)
				}
				if tc.replaced {
					newVA := execVA("va-a", "pv-b")
					newVA.UID = types.UID("uid-va-a-2")
					if err := f.tracker.Add(newVA); err != nil {
						t.Error(err)
					}
				}
			}}
			for range 3 {
				_, _ = f.ctrl.syncAttach(f.ctx, "va-a")
				_, _ = f.ctrl.syncDetach(f.ctx, "va-a")
			}
			if got := f.driver.Published("handle-pv-a"); len(got) != 0 {
				t.Fatalf("volume handle-pv-a still published to %v for a VolumeAttachment that is gone; orphans %v, record operations %v; CSI calls %q",
					got, f.ctrl.orphanSnapshot(), store.operations(), f.csiCalls())
			}
			calls := f.csiCalls()
			if i := slices.Index(calls, "ControllerUnpublishVolume handle-pv-a node-1-id OK"); i != 1 {
				t.Errorf("CSI calls = %q, want handle-pv-a unpublished right after its publish", calls)
			}
			if got := store.operations(); len(got) < 2 || got[0] != "put va-a" || got[1] != "delete va-a" {
				t.Errorf("record operations = %v, want the orphan recorded, then removed", got)
			}
		})
	}
}

// The same VolumeAttachment still there after the publish: it is attached
// (our finalizer now on it), and its publication is not taken for an
// orphan.
func TestPublishWhoseStatusIsUnchangedForAVAStillThereIsKept(t *testing.T) {
	va := attachedVA("va-a", "pv-a")
	va.Finalizers = nil
	f := newExecFixture(t, execPV("pv-a"), va, execCSINode())
	store := withStore(f)
	f.ctrl.exec.csi = &duringPublishCSI{CSIClient: f.ctrl.exec.csi, pc: va.Status.AttachmentMetadata}
	if _, err := f.ctrl.syncAttach(f.ctx, "va-a"); err != nil {
		t.Fatalf("syncAttach: %v", err)
	}
	f.requireCSICalls("ControllerPublishVolume handle-pv-a node-1-id OK")
	if got := store.operations(); len(got) != 0 || len(f.ctrl.orphanSnapshot()) != 0 {
		t.Errorf("record operations %v, orphans %v; want none", got, f.ctrl.orphanSnapshot())
	}
	if got := f.va("va-a"); !got.Status.Attached || !slices.Contains(got.Finalizers, kubenames.AttacherFinalizer(execDriver)) {
		t.Errorf("VA = finalizers %v, status %+v; want attached with our finalizer", got.Finalizers, got.Status)
	}
}
