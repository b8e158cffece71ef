package kube

import (
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/tools/cache"
)

// OwnWrites lets the controller read its own writes before the informer
// delivers them.
//
// Upstream's attacher reads VolumeAttachments from the informer cache right
// after writing them; when the watch event lags, the cache still shows
// "not attached" and the volume is published a second time. Here every
// successful write records the object the API server returned together with
// the resourceVersions it supersedes. A later read that finds one of those
// older versions in the cache gets the written object instead; as soon as the
// cache shows the written version (or anything newer), the entry is dropped
// and the cache is the truth again.
//
// A cached version is also stale when its resourceVersion is numerically
// lower than the written one: then our write was applied on top of it, and
// the written object already carries whatever that version changed. This
// matters when another client writes between our read and our status
// write: the cache then delivers that client's version (which our write
// did not replace as far as we knew) and, without the ordering, would
// show a just-attached volume as not attached and cause a second publish.
// apimachinery's resourceversion.CompareResourceVersion defines that
// ordering for kube-apiserver's integer resourceVersions; one that is not
// well formed falls back to equality only.
//
// The same overlay also holds creates and deletes the informer has not
// shown yet (ownwrites_unseen.go): the attach/detach controller creates
// and deletes VolumeAttachments, the attacher only updates objects. One
// lock guards both parts.
type OwnWrites[T Object] struct {
	mu sync.Mutex
	m  map[string]*ownWrite[T] // updates, by name
	// pending holds, by name, our patches whose call has not returned
	// (ownwrites_pending.go).
	pending map[string][]*pendingWrite
	unseen  unseenWrites[T]
}

// Object is what the overlay holds: an API object it can read the
// metadata of and copy (to mark a copy as being deleted).
type Object interface {
	metav1.Object
	runtime.Object
}

type ownWrite[T Object] struct {
	written T
	stale   sets.Set[string] // resourceVersions older than written
	// ours: the stale versions that our own earlier writes of this chain
	// produced (a pass that writes metadata, then status). Their watch
	// events need no pass either.
	ours sets.Set[string]
	// deleted: our write removed the last finalizer of an object being
	// deleted, so the API server deleted the object instead of storing a
	// new version. Its response (written) carries the resourceVersion of
	// the version it replaced, which still had the finalizer; the watch
	// delivers that version (if it is late) and then the deletion, never
	// written itself. The entry stays until forget.
	deleted bool
}

// deletedBy reports whether written is the answer to a write that deleted
// the object: being deleted and without finalizers, it is gone from the
// API server. Its resourceVersion is that of the version the write was
// applied to, which may be newer than the one the writer read (another
// client's write in between), so it is not compared with before.
func deletedBy[T metav1.Object](written T) bool {
	return written.GetDeletionTimestamp() != nil && len(written.GetFinalizers()) == 0
}

func NewOwnWrites[T Object]() *OwnWrites[T] {
	return &OwnWrites[T]{m: map[string]*ownWrite[T]{}, pending: map[string][]*pendingWrite{}, unseen: newUnseenWrites[T]()}
}

// Record notes that the object at resourceVersion before was replaced by
// written.
func (w *OwnWrites[T]) Record(before string, written T) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.recordLocked(before, written)
}

func (w *OwnWrites[T]) recordLocked(before string, written T) {
	name := written.GetName()
	e, ok := w.m[name]
	deleted := deletedBy(written)
	if ok && e.written.GetResourceVersion() == before {
		// A chain of our own writes: every version before is stale.
		e.stale.Insert(before)
		e.ours.Insert(before)
		e.written, e.deleted = written, deleted
		return
	}
	w.m[name] = &ownWrite[T]{written: written, stale: sets.New(before), ours: sets.New[string](), deleted: deleted}
}

// RecordIn is Record for a write that may have deleted the object (the
// removal of its last finalizer). The informer's delete handler forgets
// the entry, but it may have run before this record; the informer empties
// its store before it calls the handler, so if store has no object of
// that name any more, the entry is forgotten here at once.
func (w *OwnWrites[T]) RecordIn(store cache.Store, before string, written T) {
	w.Record(before, written)
	w.forgetDeleted(store, written)
}

// forgetDeleted forgets the entry of written at once when it deleted the
// object and store no longer has it (see RecordIn).
func (w *OwnWrites[T]) forgetDeleted(store cache.Store, written T) {
	if !deletedBy(written) {
		return
	}
	if _, exists, err := store.GetByKey(written.GetName()); err == nil && !exists {
		w.Forget(written.GetName())
	}
}

// resolveLocked returns the freshest known version of cached: our own
// write when the cache still holds a version that write replaced, else
// cached. Readers reach it through OverlaidStore (Get, List), which read
// the store under the same lock.
func (w *OwnWrites[T]) resolveLocked(cached T) T {
	e, ok := w.m[cached.GetName()]
	if !ok {
		return cached
	}
	rv := cached.GetResourceVersion()
	if e.stale.Has(rv) || olderThan(rv, e.written.GetResourceVersion()) ||
		e.deleted && rv == e.written.GetResourceVersion() {
		// (A write that deleted the object answers at the resourceVersion
		// of the version it deleted: that version is not our write.)
		return e.written
	}
	// The cache caught up with our write or moved past it.
	delete(w.m, cached.GetName())
	return cached
}

// IsOwn reports whether obj is exactly a version we wrote, so that its watch
// event needs no new pass. Such an event means the informer's cache now
// holds our write (client-go updates the store before it notifies), so
// the entry is dropped: a volume at rest keeps no copy of its last write.
func (w *OwnWrites[T]) IsOwn(obj T) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	e, ok := w.m[obj.GetName()]
	if ok && e.ours.Has(obj.GetResourceVersion()) {
		// An earlier write of our chain: the cache is still behind the
		// last one, so the entry stays.
		return true
	}
	if !ok || e.written.GetResourceVersion() != obj.GetResourceVersion() {
		return false
	}
	if e.deleted {
		// The version our write deleted, delivered late: it needs no pass,
		// but the cache now holds it, finalizer and all, so the entry must
		// stay until the deletion arrives.
		return true
	}
	delete(w.m, obj.GetName())
	return true
}

// Forget drops the update entry of name (the object was deleted). The
// entries of creates and deletes the informer has not shown end by their
// own rules (Gone, View).
func (w *OwnWrites[T]) Forget(name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.m, name)
}

// olderThan reports whether resourceVersion a is known to precede b (both
// well-formed, per apimachinery's comparison).
func olderThan(a, b string) bool {
	c, err := resourceversion.CompareResourceVersion(a, b)
	return err == nil && c < 0
}

// Len returns how many entries the overlay holds: writes the cache has
// not shown yet, deletions not delivered yet, and creates and deletes the
// informer has not settled. A volume at rest has none.
func (w *OwnWrites[T]) Len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.m) + w.unseen.len()
}
