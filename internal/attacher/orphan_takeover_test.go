package attacher

import (
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clienttesting "k8s.io/client-go/testing"

	"github.com/latchcsi/latch/internal/csimock"
)

// An orphaned publication is taken over by a new VolumeAttachment of the
// same name for the same volume and node ID only once that VA carries our
// finalizer (decide.OwnerOnceRecorded). Here the new VA is deleted before
// our metadata write lands (the attach/detach controller deletes a VA it
// just created when the Pod goes away: no finalizer, so the object is gone
// at once): the orphan is still pending, and the next pass of the name
// unpublishes the volume.
func TestOrphanStaysUntilTheNewVAsFinalizerLandsAndIsUnpublishedWhenTheVAGoesFirst(t *testing.T) {
	f := newExecFixture(t, execPV("pv-a"), execVA("va-a", "pv-a"), execCSINode())
	store := withStore(f)

	// Pass 1: the publish succeeds, the VA is force-deleted meanwhile
	// (status write answers NotFound): an orphan. Its first unpublish fails
	// transiently, so the orphan stays pending.
	statusDeleted := false
	f.client.PrependReactor("patch", "volumeattachments", func(action clienttesting.Action) (bool, runtime.Object, error) {
		if action.GetSubresource() != "status" || statusDeleted {
			return false, nil, nil
		}
		statusDeleted = true
		if err := f.tracker.Delete(vaGVR, "", "va-a"); err != nil {
			return true, nil, err
		}
		return true, nil, apierrors.NewNotFound(vaGVR.GroupResource(), "va-a")
	})
	if _, err := f.driver.AddFault(csimock.Rule{Method: "ControllerUnpublishVolume", Once: true, Code: codes.Unavailable, Message: "busy"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.ctrl.syncAttach(f.ctx, "va-a"); err == nil {
		t.Fatal("pass 1 succeeded, want the failed orphan unpublish")
	}
	if _, ok := f.ctrl.orphanSnapshot()["va-a"]; !ok {
		t.Fatalf("no orphan pending after pass 1: %v", f.ctrl.orphanSnapshot())
	}
	f.waitFor("old VA gone from the cache", func() bool { _, exists, _ := f.vaStore.GetByKey("va-a"); return !exists })

	// The attach/detach controller creates a new VA of the same name (same
	// volume, same node) ...
	newVA := execVA("va-a", "pv-a")
	newVA.UID = types.UID("uid-va-a-2")
	if err := f.tracker.Add(newVA); err != nil {
		t.Fatal(err)
	}
	f.waitFor("new VA in the cache", func() bool {
		va, _ := LookupVA(f.vaStore, "va-a")
		return va != nil && va.UID == "uid-va-a-2"
	})
	// ... and deletes it again (the Pod went away) just before our
	// finalizer write lands: the VA has no finalizer, so it is gone.
	f.client.PrependReactor("patch", "volumeattachments", func(action clienttesting.Action) (bool, runtime.Object, error) {
		if action.GetSubresource() != "" {
			return false, nil, nil
		}
		_ = f.tracker.Delete(vaGVR, "", "va-a")
		return true, nil, apierrors.NewNotFound(vaGVR.GroupResource(), "va-a")
	})
	_, _ = f.ctrl.syncAttach(f.ctx, "va-a")
	f.waitFor("new VA gone from the cache", func() bool { _, exists, _ := f.vaStore.GetByKey("va-a"); return !exists })
	// The key's retries, and the detach queue, find nothing to do.
	for range 3 {
		_, _ = f.ctrl.syncAttach(f.ctx, "va-a")
		_, _ = f.ctrl.syncDetach(f.ctx, "va-a")
	}

	if got := f.driver.Published("handle-pv-a"); len(got) != 0 {
		t.Errorf("volume handle-pv-a still published to %v with no VolumeAttachment and no orphan left to unpublish it (orphans %v, record ops %v); CSI calls %q",
			got, f.ctrl.orphanSnapshot(), store.operations(), f.csiCalls())
	}
}

// A new VolumeAttachment of the same name for the same volume and node ID
// is worked on while the orphan waits for its finalizer; once its pass
// wrote the finalizer (and published: idempotent), it takes the
// publication over in that same pass: no unpublish, the record removed.
func TestOrphanTakenOverByNewVAOnceItsFinalizerLandsWithoutUnpublish(t *testing.T) {
	f := newExecFixture(t, execPV("pv-a"), execCSINode())
	store := withStore(f)
	store.recs["va-a"] = orphanRecord{VolumeAttachment: "va-a", UID: "uid-old", VolumeHandle: "handle-pv-a", NodeID: "node-1-id", NodeName: "node-1", PersistentVolume: "pv-a"}
	f.ctrl.loadOrphans(f.ctx)
	newVA := execVA("va-a", "pv-a")
	if err := f.tracker.Add(newVA); err != nil {
		t.Fatal(err)
	}
	f.waitFor("new VA in the cache", func() bool { va, _ := LookupVA(f.vaStore, "va-a"); return va != nil })
	if _, err := f.ctrl.syncAttach(f.ctx, "va-a"); err != nil {
		t.Fatalf("syncAttach: %v", err)
	}
	f.requireCSICalls("ControllerPublishVolume handle-pv-a node-1-id OK")
	if got := store.operations(); !slices.Equal(got, []string{"delete va-a"}) {
		t.Errorf("record operations = %v, want [delete va-a]", got)
	}
	if left := f.ctrl.orphanSnapshot(); len(left) != 0 {
		t.Errorf("orphans left = %v, want none", left)
	}
	if va := f.va("va-a"); !va.Status.Attached {
		t.Errorf("new VA not attached: %+v", va.Status)
	}
}
