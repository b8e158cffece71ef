package kube

import (
	"slices"
	"testing"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func unseenVA(uid types.UID) *storagev1.VolumeAttachment {
	return &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: "csi-a", UID: uid}}
}

type vaWrites = OwnWrites[*storagev1.VolumeAttachment]

// TestOwnWrites_createAgainstEveryInformerOrder plays the steps of one
// create and the informer around it in the orders they can come in, and
// checks what the next pass believes when its store read finds nothing:
// the object (wait for the informer) or nothing (create it).
func TestOwnWrites_createAgainstEveryInformerOrder(t *testing.T) {
	ours, older := unseenVA("uid-new"), unseenVA("uid-old")
	type step func(w *vaWrites)
	started := func(w *vaWrites) { w.CreateStarted("csi-a") }
	done := func(w *vaWrites) { w.CreateDone("csi-a", ours, time.Time{}) }
	failed := func(w *vaWrites) { w.CreateFailed("csi-a") }
	// The informer's add event has no effect on the overlay; a pass that
	// found the object in the store ends it.
	seenByAPass := func(w *vaWrites) { w.View("csi-a", ours, true) }
	goneOurs := func(w *vaWrites) { w.Gone(ours) }
	goneOlder := func(w *vaWrites) { w.Gone(older) }
	deletedByUs := func(w *vaWrites) { w.Deleted("csi-a", ours.UID, false, time.Time{}) }
	deletedByUsNotFound := func(w *vaWrites) { w.Deleted("csi-a", ours.UID, true, time.Time{}) }

	for _, tc := range []struct {
		name  string
		steps []step
		// wantOverlay: a pass whose store read finds nothing still sees
		// our object.
		wantOverlay bool
	}{
		{"created, informer not caught up (or its add handler ran after the pass read the store)", []step{started, done}, true},
		{"created, a pass found it in the store, informer then dropped it", []step{started, done, seenByAPass}, false},
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
		{"deleted by us after a pass found it in the store (the store tells from then on)", []step{started, done, seenByAPass, deletedByUs}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := NewOwnWrites[*storagev1.VolumeAttachment]()
			for _, s := range tc.steps {
				s(w)
			}
			got, ok := w.View("csi-a", nil, false)
			if ok != tc.wantOverlay || ok != (got != nil) {
				t.Fatalf("view of an empty store = %v, %v, want overlay %v", got, ok, tc.wantOverlay)
			}
			if got != nil && got.UID != ours.UID {
				t.Errorf("overlay uid = %s, want %s", got.UID, ours.UID)
			}
			if deleted := got != nil && got.DeletionTimestamp != nil; got != nil && deleted != (len(w.unseen.deletedUnseen) == 1) {
				t.Errorf("overlay %+v: being deleted = %v, want %v", got, deleted, len(w.unseen.deletedUnseen) == 1)
			}
			if len(w.unseen.creating) != 0 {
				t.Errorf("create calls still tracked after they returned: %v", w.unseen.creating)
			}
		})
	}
}

func TestOwnWrites_storeCaughtUpWithACreate_overlayDropped(t *testing.T) {
	w := NewOwnWrites[*storagev1.VolumeAttachment]()
	ours := unseenVA("uid-1")
	w.CreateStarted(ours.Name)
	w.CreateDone(ours.Name, ours, time.Time{})
	w.CreateUncertain(ours.Name)
	listed := ours.DeepCopy()
	listed.Status.Attached = true
	if got, ok := w.View(ours.Name, listed, true); !ok || got != listed {
		t.Fatalf("view with the object in the store = %+v, want the stored object", got)
	}
	if w.Len() != 0 || w.IsCreateUncertain(ours.Name) {
		t.Errorf("overlay kept %d entries (uncertain %v) after the store showed the object", w.Len(), w.IsCreateUncertain(ours.Name))
	}
}

func TestOwnWrites_ownDeleteNotInTheStoreYet_seenAsDeleting(t *testing.T) {
	w := NewOwnWrites[*storagev1.VolumeAttachment]()
	listed := unseenVA("uid-1")
	w.Deleted(listed.Name, listed.UID, false, time.Time{})
	got, _ := w.View(listed.Name, listed, true)
	if got == listed || got.DeletionTimestamp == nil {
		t.Fatalf("view = %+v, want a copy marked as being deleted", got)
	}
	if listed.DeletionTimestamp != nil {
		t.Error("the stored object was modified")
	}
	// A different object of that name is not ours to mark.
	if got, _ := w.View(listed.Name, unseenVA("uid-2"), true); got.DeletionTimestamp != nil {
		t.Errorf("view of another object of the name = %+v, want it as stored", got)
	}
	// Once the store no longer has it, the overlay is gone.
	w.View(listed.Name, nil, false)
	if w.Len() != 0 {
		t.Errorf("delete overlay kept: %v", w.unseen.deleted)
	}
}

// The verify pass asks the API server only about entries the informer has
// not settled for a whole period, and forgets one only if it is still the
// object it asked about.
func TestOwnWrites_unseenOlderThanAPeriod_forgottenOnlyIfStillTheSameObject(t *testing.T) {
	w := NewOwnWrites[*storagev1.VolumeAttachment]()
	t0 := time.Unix(1000, 0)
	created := func(name string, uid types.UID, at time.Time) {
		w.CreateStarted(name)
		w.CreateDone(name, &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: name, UID: uid}}, at)
	}
	created("b-created", "uid-b", t0)
	created("a-deleted", "uid-a", t0)
	w.Deleted("a-deleted", "uid-a", false, t0)
	created("c-recent", "uid-c", t0.Add(50*time.Second))

	got := w.Unseen(t0.Add(time.Minute+time.Second), time.Minute)
	want := []UnseenWrite{{Name: "a-deleted", UID: "uid-a", Deleted: true}, {Name: "b-created", UID: "uid-b"}}
	if !slices.Equal(got, want) {
		t.Fatalf("Unseen = %+v, want %+v", got, want)
	}
	if w.ForgetUnseen(UnseenWrite{Name: "b-created", UID: "uid-other"}) {
		t.Error("ForgetUnseen ended the entry of another object of the name")
	}
	for _, uw := range want {
		if !w.ForgetUnseen(uw) {
			t.Errorf("ForgetUnseen(%+v) = false, want the entry ended", uw)
		}
		if v, ok := w.View(uw.Name, nil, false); ok {
			t.Errorf("after ForgetUnseen, view of %s = %+v, want nothing", uw.Name, v)
		}
	}
	if w.Len() != 1 {
		t.Errorf("overlay entries = %d, want only c-recent's", w.Len())
	}
}
