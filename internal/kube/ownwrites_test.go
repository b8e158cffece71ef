package kube

import (
	"testing"

	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// resolve is what a read through the overlay gives for cached, the
// store's version (OverlaidStore.Get without the store).
func resolve[T Object](w *OwnWrites[T], cached T) T {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.resolveLocked(cached)
}

func vaAt(rv string, attached bool) *storagev1.VolumeAttachment {
	return &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: "va", ResourceVersion: rv},
		Status:     storagev1.VolumeAttachmentStatus{Attached: attached},
	}
}

// Our status write (10 → 12) was applied on top of another client's write
// (11) that the cache delivers first: 11 must not count as the truth, or
// the just-attached volume looks unattached and is published again.
func TestOwnWrites_anotherClientsOlderVersionInTheCacheResolvesToOurWrite(t *testing.T) {
	w := NewOwnWrites[*storagev1.VolumeAttachment]()
	w.Record("10", vaAt("12", true))
	for _, rv := range []string{"10", "11"} {
		if got := resolve(w, vaAt(rv, false)); got.ResourceVersion != "12" || !got.Status.Attached {
			t.Errorf("cache at %s resolved to rv %s attached=%v, want our write (12, attached)", rv, got.ResourceVersion, got.Status.Attached)
		}
	}
	if w.IsOwn(vaAt("11", false)) {
		t.Errorf("isOwn: another client's version counted as ours")
	}
	// The cache caught up (or moved past us): it is the truth again and the
	// entry is dropped.
	if got := resolve(w, vaAt("13", true)); got.ResourceVersion != "13" {
		t.Errorf("cache at 13 resolved to %s, want the cache", got.ResourceVersion)
	}
	if got := resolve(w, vaAt("11", false)); got.ResourceVersion != "11" {
		t.Errorf("after the entry was dropped, resolve returned %s, want the cache", got.ResourceVersion)
	}
}

// resourceVersions that are not well-formed integers are compared for
// equality only: nothing is assumed about their order.
func TestOwnWrites_opaqueResourceVersionsComparedForEqualityOnly(t *testing.T) {
	w := NewOwnWrites[*storagev1.VolumeAttachment]()
	w.Record("a", vaAt("c", true))
	if got := resolve(w, vaAt("a", false)); got.ResourceVersion != "c" {
		t.Errorf("the version we replaced resolved to %s, want our write", got.ResourceVersion)
	}
	w.Record("a", vaAt("c", true))
	if got := resolve(w, vaAt("b", false)); got.ResourceVersion != "b" {
		t.Errorf("an unknown opaque version resolved to %s, want the cache", got.ResourceVersion)
	}
}

// The watch delivering exactly our write means the cache holds it: the
// entry goes, so volumes at rest keep no copy of their last write.
func TestOwnWrites_ourVersionDeliveredByTheWatchDropsTheEntry(t *testing.T) {
	w := NewOwnWrites[*storagev1.VolumeAttachment]()
	w.Record("10", vaAt("12", true))
	if !w.IsOwn(vaAt("12", true)) {
		t.Fatal("our written version not recognised")
	}
	if len(w.m) != 0 {
		t.Errorf("entries after the watch delivered our write: %d, want 0", len(w.m))
	}
	if w.IsOwn(vaAt("12", true)) {
		t.Errorf("a second delivery of the same version counted as ours after the entry was dropped")
	}
}

// deletedByOurWrite returns a VolumeAttachment at rv being deleted with our
// finalizer, and the API server's answer to removing that finalizer: the
// same object at the same resourceVersion without finalizers.
func deletedByOurWrite(rv string) (withFinalizer, answer *storagev1.VolumeAttachment) {
	now := metav1.Now()
	withFinalizer = vaAt(rv, true)
	withFinalizer.DeletionTimestamp, withFinalizer.Finalizers = &now, []string{"external-attacher/x"}
	answer = withFinalizer.DeepCopy()
	answer.Finalizers = nil
	return withFinalizer, answer
}

// Removing the last finalizer of a VolumeAttachment being deleted makes
// the API server delete it instead of storing a new version: the patch
// response is the object without finalizers but at the resourceVersion of
// the version it replaced (10), which still has our finalizer. When that
// version's event reaches the informer late, it is not our write: the
// entry must survive it, or a pass in the meantime sees our finalizer on
// the cached version and unpublishes the volume a second time.
func TestOwnWrites_lastFinalizerRemovalSurvivesTheLateEventOfTheVersionItDeleted(t *testing.T) {
	w := NewOwnWrites[*storagev1.VolumeAttachment]()
	before, written := deletedByOurWrite("10")
	w.Record("10", written)

	requireDeletedVersionStaysHidden(t, w, before, "10")
	// Gone: the informer's delete drops the entry.
	w.Forget("va")
	if got := resolve(w, before); len(got.Finalizers) != 1 {
		t.Errorf("after forget, resolve returned finalizers %v, want the cache", got.Finalizers)
	}
	// A new object of the same name (a later resourceVersion) is the truth.
	w.Record("10", written)
	if got := resolve(w, vaAt("15", false)); got.ResourceVersion != "15" {
		t.Errorf("a newer object of the same name resolved to %s, want the cache", got.ResourceVersion)
	}
}

// Another client's write (11: the ListVolumes reconcile's status write, say)
// lands between our read (10) and our removal of the last finalizer. The
// API server applies the removal to 11 and deletes the object, answering at
// 11: a version that still has our finalizer. Neither its late event nor a
// read of it from the cache may show the finalizer again.
func TestOwnWrites_lastFinalizerRemovalAppliedToAnotherClientsVersion(t *testing.T) {
	w := NewOwnWrites[*storagev1.VolumeAttachment]()
	other, gone := deletedByOurWrite("11")
	w.Record("10", gone)

	requireDeletedVersionStaysHidden(t, w, other, "10", "11")
}

// requireDeletedVersionStaysHidden checks that the late event of the
// version our write deleted needs no pass, and that after it the cache at
// each of cachedRVs still resolves to our write, without finalizers.
func requireDeletedVersionStaysHidden(t *testing.T, w *OwnWrites[*storagev1.VolumeAttachment], deleted *storagev1.VolumeAttachment, cachedRVs ...string) {
	t.Helper()
	if !w.IsOwn(deleted) {
		t.Errorf("isOwn(the version our write deleted) = false, want true: it needs no pass of its own")
	}
	for _, rv := range cachedRVs {
		cached := deleted.DeepCopy()
		cached.ResourceVersion = rv
		if got := resolve(w, cached); len(got.Finalizers) != 0 {
			t.Errorf("after the late event, the cache at %s resolved to finalizers %v, want our write without them", rv, got.Finalizers)
		}
	}
}

// The informer may remove the object and run its delete handler (which
// forgets the entry) before the write that deleted it is recorded: then
// the record must not linger for an object that is gone.
func TestOwnWrites_recordInForgetsADeletionTheInformerAlreadyShowed(t *testing.T) {
	store := cache.NewStore(cache.MetaNamespaceKeyFunc)
	withFinalizer, answer := deletedByOurWrite("10")

	w := NewOwnWrites[*storagev1.VolumeAttachment]()
	w.RecordIn(store, "10", answer)
	if len(w.m) != 0 {
		t.Errorf("entries after recording a deletion the store already shows = %d, want 0", len(w.m))
	}

	// Still in the store: the entry stays until the delete handler runs.
	if err := store.Add(withFinalizer); err != nil {
		t.Fatal(err)
	}
	w.RecordIn(store, "10", answer)
	if got := resolve(w, withFinalizer); len(got.Finalizers) != 0 {
		t.Errorf("cached version resolved to finalizers %v, want our write without them", got.Finalizers)
	}
}
