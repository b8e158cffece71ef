package kube

import (
	"cmp"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
)

// unseenWrites is the part of OwnWrites that overlays creates and deletes
// (the attach/detach controller's VolumeAttachments) until the informer
// shows them, so that a pass right after a create does not see "no
// object" and a pass right after a delete sees the deleted object as
// being deleted, not as live (which could put a volume being detached
// back into the node's volumesAttached) and not as gone (which would let
// an exclusive volume attach to another node before the driver
// unpublished it here). It is guarded by OwnWrites.mu.
//
// A pass reads the informer's store and then this overlay, not both at
// once, and the informer stores an object before it runs the event
// handlers. So an entry is not dropped by the informer's add event: a
// pass that read the store just before the informer stored the object
// would then find neither and create the object a second time. A created
// entry ends when a read finds its name in the store (View), when the
// informer reports that very object deleted (Gone), or when we delete it
// ourselves.
type unseenWrites[T Object] struct {
	// created holds objects created by us that no read has found in the
	// store yet, and when each create returned.
	created map[string]timed[T]
	// deleted holds the UIDs of objects deleted by us that the store
	// still shows.
	deleted map[string]types.UID
	// deletedUnseen holds objects we created and then deleted before any
	// read found them in the store, as being deleted, and when. For them
	// "not in the store" does not mean gone: the informer may not have
	// shown the object yet, and a finalizer (csi-attacher's, with a
	// publish in flight) may keep it long after our delete returned. An
	// entry ends when a read finds an object of that name in the store
	// (from then on the store tells), when the informer reports that
	// object deleted, or ForgetUnseen (the API server no longer has it).
	deletedUnseen map[string]timed[T]
	// creating holds, per name whose create call has not returned, the
	// UIDs of objects of that name the informer reported deleted
	// meanwhile. The caller never overlaps two creates of one name.
	creating map[string]sets.Set[types.UID]
	// uncertain holds the names whose create ended without a clear
	// answer (an error, a timeout, AlreadyExists): the API server may
	// have stored the object although we were not told. "Not in the
	// store" does not mean "absent" for them; the caller asks the API
	// server. An entry ends when a read finds the name in the store, or
	// CreateSettled.
	uncertain sets.Set[string]
}

type timed[T Object] struct {
	obj T
	at  time.Time
}

func newUnseenWrites[T Object]() unseenWrites[T] {
	return unseenWrites[T]{created: map[string]timed[T]{}, deleted: map[string]types.UID{},
		deletedUnseen: map[string]timed[T]{}, creating: map[string]sets.Set[types.UID]{},
		uncertain: sets.New[string]()}
}

func (u *unseenWrites[T]) len() int {
	return len(u.created) + len(u.deleted) + len(u.deletedUnseen) + len(u.uncertain)
}

// dropIf ends the entry of name in m if it is the object uid, and reports
// whether it did.
func dropIf[T Object](m map[string]timed[T], name string, uid types.UID) bool {
	if e, ok := m[name]; ok && e.obj.GetUID() == uid {
		delete(m, name)
		return true
	}
	return false
}

// markedDeleting returns a copy of obj with a deletionTimestamp of at.
func markedDeleting[T Object](obj T, at time.Time) T {
	deleting := obj.DeepCopyObject().(T)
	deleting.SetDeletionTimestamp(&metav1.Time{Time: at})
	return deleting
}

// CreateStarted is called before the create call of name (or a read that
// settles a create of unknown outcome, which is bracketed the same way).
func (w *OwnWrites[T]) CreateStarted(name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.unseen.creating[name] = sets.New[types.UID]()
}

// CreateDone is called when the create call of name returned created, the
// object the server stored. The informer may have shown the object, and
// even its deletion by another client, before the call returned: a
// created object already reported deleted is not overlaid, or the caller
// would wait for it forever instead of creating it again.
func (w *OwnWrites[T]) CreateDone(name string, created T, now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	u := &w.unseen
	goneMeanwhile := u.creating[name]
	delete(u.creating, name)
	if goneMeanwhile.Has(created.GetUID()) {
		return
	}
	u.created[name] = timed[T]{obj: created, at: now}
	delete(u.deleted, name)
}

// CreateFailed is CreateDone for a call that stored nothing we know of.
func (w *OwnWrites[T]) CreateFailed(name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.unseen.creating, name)
}

// CreateUncertain records that the create of name ended without a clear
// answer.
func (w *OwnWrites[T]) CreateUncertain(name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.unseen.uncertain.Insert(name)
}

// IsCreateUncertain reports whether the outcome of our create of name is
// still unknown.
func (w *OwnWrites[T]) IsCreateUncertain(name string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.unseen.uncertain.Has(name)
}

// CreateSettled ends the uncertainty of name: the API server answered (the
// object it has, if any, was handed to CreateDone).
func (w *OwnWrites[T]) CreateSettled(name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.unseen.uncertain.Delete(name)
}

// Deleted is called after our delete of the object name (uid) returned;
// alreadyGone is true when the server answered NotFound. An object we
// created that no read has found in the store yet is overlaid as being
// deleted from now (see unseenWrites.deletedUnseen).
func (w *OwnWrites[T]) Deleted(name string, uid types.UID, alreadyGone bool, now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	u := &w.unseen
	u.deleted[name] = uid
	if c, ok := u.created[name]; ok && c.obj.GetUID() == uid && !alreadyGone {
		u.deletedUnseen[name] = timed[T]{obj: markedDeleting(c.obj, now), at: now}
	}
	delete(u.created, name)
}

// Gone is called for every informer delete of obj.
func (w *OwnWrites[T]) Gone(obj T) {
	w.mu.Lock()
	defer w.mu.Unlock()
	u := &w.unseen
	name, uid := obj.GetName(), obj.GetUID()
	delete(u.deleted, name)
	dropIf(u.deletedUnseen, name, uid)
	// Deleted by someone else: the caller must create it again. The delete
	// of an older object of the same name (detached and attached again)
	// leaves the new one's entry alone.
	dropIf(u.created, name, uid)
	if meanwhile, ok := u.creating[name]; ok {
		meanwhile.Insert(uid)
	}
}

// View returns what the caller should believe about the object name,
// given what its store holds: cached when exists, else nothing. The
// returned object is shared: never modify it. A store that shows the
// name is the truth from then on for our creates and deletes of it (and
// settles a create of unknown outcome), apart from an object we deleted
// that the store still shows as live: it is returned as being deleted,
// since a finalizer may keep it until its driver is done. A store without
// the name ends the update entry of name and any delete of ours it had
// shown; an object we created or deleted that the store never showed is
// returned from the overlay.
func (w *OwnWrites[T]) View(name string, cached T, exists bool) (T, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.viewLocked(name, cached, exists)
}

// viewLocked is View with w.mu held.
func (w *OwnWrites[T]) viewLocked(name string, cached T, exists bool) (T, bool) {
	u := &w.unseen
	if !exists {
		delete(w.m, name)
		delete(u.deleted, name)
		if d, ok := u.deletedUnseen[name]; ok {
			return d.obj, true
		}
		c, ok := u.created[name]
		return c.obj, ok
	}
	delete(u.created, name)
	delete(u.deletedUnseen, name)
	u.uncertain.Delete(name)
	t := w.resolveLocked(cached)
	if uid, ok := u.deleted[name]; ok && uid == t.GetUID() && t.GetDeletionTimestamp() == nil {
		// Only the presence of the timestamp matters to the caller.
		return markedDeleting(t, time.Time{}), true
	}
	return t, true
}

// UnseenWrite is a create or delete of ours that the informer has not
// settled (Unseen).
type UnseenWrite struct {
	Name string
	UID  types.UID
	// Deleted: we deleted the object before the informer ever showed it
	// (else we created it and no read has found it in the store).
	Deleted bool
}

// Unseen returns the creates and deletes of ours the informer has not
// settled for longer than age: created objects no read has found in the
// store (normally none: the informer shows a new object within moments),
// and objects we deleted before the informer showed them that it still
// has not reported gone. If the object was deleted while the watch was
// down, nothing but the API server can end such an entry (ForgetUnseen).
// Deletes come first, each part sorted by name.
func (w *OwnWrites[T]) Unseen(now time.Time, age time.Duration) []UnseenWrite {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []UnseenWrite
	for _, deleted := range []bool{true, false} {
		m := w.unseen.created
		if deleted {
			m = w.unseen.deletedUnseen
		}
		start := len(out)
		for name, e := range m {
			if now.Sub(e.at) > age {
				out = append(out, UnseenWrite{Name: name, UID: e.obj.GetUID(), Deleted: deleted})
			}
		}
		slices.SortFunc(out[start:], func(a, b UnseenWrite) int { return cmp.Compare(a.Name, b.Name) })
	}
	return out
}

// ForgetUnseen ends the entry of uw if it is still the object uw.UID: the
// API server no longer has it, and the informer will not say so (it never
// showed the object). It reports whether it ended one.
func (w *OwnWrites[T]) ForgetUnseen(uw UnseenWrite) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if uw.Deleted {
		return dropIf(w.unseen.deletedUnseen, uw.Name, uw.UID)
	}
	return dropIf(w.unseen.created, uw.Name, uw.UID)
}
