package controller

import (
	"testing"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func testVA(uid types.UID) *storagev1.VolumeAttachment {
	return &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: "csi-a", UID: uid}}
}

// TestOwnWrites_createAgainstEveryInformerOrder plays the steps of one
// create and the informer around it in the orders they can come in, and
// checks what the next pass believes when its cache read finds nothing:
// the object (wait for the informer) or nothing (create it).
func TestOwnWrites_createAgainstEveryInformerOrder(t *testing.T) {
	ours, older := testVA("uid-new"), testVA("uid-old")
	type step func(w *ownWrites)
	started := func(w *ownWrites) { w.createStarted("csi-a") }
	done := func(w *ownWrites) { w.createDone("csi-a", ours, time.Time{}) }
	failed := func(w *ownWrites) { w.createDone("csi-a", nil, time.Time{}) }
	// The informer's add event has no effect on the overlay; a pass that
	// found the object in the cache ends it.
	seenByAPass := func(w *ownWrites) { w.view("csi-a", ours) }
	goneOurs := func(w *ownWrites) { w.gone(ours) }
	goneOlder := func(w *ownWrites) { w.gone(older) }
	deletedByUs := func(w *ownWrites) { w.recordDelete("csi-a", ours.UID, false, time.Time{}) }
	deletedByUsNotFound := func(w *ownWrites) { w.recordDelete("csi-a", ours.UID, true, time.Time{}) }

	for _, tc := range []struct {
		name  string
		steps []step
		// wantOverlay: a pass whose cache read finds nothing still sees
		// our object.
		wantOverlay bool
	}{
		{"created, informer not caught up (or its add handler ran after the pass read the cache)", []step{started, done}, true},
		{"created, a pass found it in the cache, informer then dropped it", []step{started, done, seenByAPass}, false},
		{"create failed", []step{started, failed}, false},
		{"deleted by another client after the create returned", []step{started, done, goneOurs}, false},
		{"deleted by another client before the create returned", []step{started, goneOurs, done}, false},
		{"the previous object's delete event after the create returned", []step{started, done, goneOlder}, true},
		{"the previous object's delete event while the create ran", []step{started, goneOlder, done}, true},
		// Deleted by us before any pass saw it: it may still exist (the
		// attacher's finalizer, a publish in flight), so it is seen as
		// being deleted until the informer reports it gone.
		{"deleted by us before the informer showed it", []step{started, done, deletedByUs}, true},
		{"deleted by us before the informer showed it, then reported gone", []step{started, done, deletedByUs, goneOurs}, false},
		{"deleted by us, answered NotFound", []step{started, done, deletedByUsNotFound}, false},
		{"deleted by us after a pass found it in the cache (the cache tells from then on)", []step{started, done, seenByAPass, deletedByUs}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newOwnWrites()
			for _, s := range tc.steps {
				s(w)
			}
			got := w.view("csi-a", nil)
			if (got != nil) != tc.wantOverlay {
				t.Fatalf("view of an empty cache = %v, want overlay %v", got, tc.wantOverlay)
			}
			if got != nil && got.UID != ours.UID {
				t.Errorf("overlay uid = %s, want %s", got.UID, ours.UID)
			}
			if deleted := got != nil && got.DeletionTimestamp != nil; got != nil && deleted != (len(w.deletedUnseen) == 1) {
				t.Errorf("overlay %+v: being deleted = %v, want %v", got, deleted, len(w.deletedUnseen) == 1)
			}
			if len(w.creating) != 0 {
				t.Errorf("create calls still tracked after they returned: %v", w.creating)
			}
		})
	}
}

func TestOwnWrites_cacheCaughtUp_overlayDropped(t *testing.T) {
	w := newOwnWrites()
	ours := testVA("uid-1")
	w.createStarted(ours.Name)
	w.createDone(ours.Name, ours, time.Time{})
	listed := ours.DeepCopy()
	listed.Status.Attached = true
	if got := w.view(ours.Name, listed); got != listed {
		t.Fatalf("view with the object in the cache = %+v, want the cached object", got)
	}
	if len(w.created) != 0 {
		t.Errorf("overlay kept after the cache showed the object: %v", w.created)
	}
}

func TestOwnWrites_ownDeleteNotInTheCacheYet_seenAsDeleting(t *testing.T) {
	w := newOwnWrites()
	listed := testVA("uid-1")
	w.recordDelete(listed.Name, listed.UID, false, time.Time{})
	got := w.view(listed.Name, listed)
	if got == listed || got.DeletionTimestamp == nil {
		t.Fatalf("view = %+v, want a copy marked as being deleted", got)
	}
	if listed.DeletionTimestamp != nil {
		t.Error("the cached object was modified")
	}
	// A different object of that name is not ours to mark.
	if got := w.view(listed.Name, testVA("uid-2")); got.DeletionTimestamp != nil {
		t.Errorf("view of another object of the name = %+v, want it as listed", got)
	}
	// Once the cache no longer has it, the overlay is gone.
	w.view(listed.Name, nil)
	if len(w.deleted) != 0 {
		t.Errorf("delete overlay kept: %v", w.deleted)
	}
}
