package controller

import (
	"sync"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// ownWrites overlays the VolumeAttachment informer with the controller's
// own writes until the informer shows them, so that a pass right after a
// create does not see "no VolumeAttachment" and a pass right after a
// delete sees the deleted one as being deleted, not as a live attachment
// (which could put a volume being detached back into the node's
// volumesAttached) and not as gone (which would let an exclusive volume
// attach to another node before the driver unpublished it here).
//
// A pass reads the informer cache and then this overlay, not both at
// once, and the informer stores an object before it runs the event
// handlers. So an overlay entry is not dropped by the informer's add
// event: a pass that read the cache just before the informer stored the
// object would then find neither and create the object a second time. A
// created entry ends when a pass finds its name in the cache (view),
// when the informer reports that very object deleted (gone), or when we
// delete it ourselves.
type ownWrites struct {
	mu sync.Mutex
	// created holds VAs created by us that no pass has found in the
	// informer cache yet, and when each create returned.
	created timedVAs
	// deleted holds the UIDs of VAs deleted by us that the informer still
	// shows.
	deleted map[string]types.UID
	// deletedUnseen holds VAs we created and then deleted before any pass
	// found them in the informer cache, as being deleted, and when. For
	// them "not in the cache" does not mean gone: the informer may not
	// have shown the object yet, and csi-attacher's finalizer may keep it,
	// with a publish in flight, long after our delete returned. Treating it
	// as gone would let an exclusive volume attach to a second node. An
	// entry ends when the informer shows an object of that name (from then
	// on the cache tells), reports that object deleted, or the verify pass
	// finds it gone from the API server.
	deletedUnseen timedVAs
	// creating holds, per name whose create call has not returned, the
	// UIDs of objects of that name the informer reported deleted
	// meanwhile. The creates of one name never overlap: a name belongs to
	// one key, and one worker at a time passes a key.
	creating map[string]map[types.UID]bool
	// uncertain holds the names whose create ended without a clear
	// answer (an error, a timeout, AlreadyExists): the API server may
	// have stored the object although we were not told. "Not in the
	// informer cache" does not mean "absent" for them; the key's pass
	// asks the API server (settleUncertainCreate). An entry ends when a
	// pass finds the name in the cache, or the API server answers.
	uncertain map[string]struct{}
}

func newOwnWrites() *ownWrites {
	return &ownWrites{created: timedVAs{}, deleted: map[string]types.UID{},
		creating: map[string]map[types.UID]bool{}, deletedUnseen: timedVAs{},
		uncertain: map[string]struct{}{}}
}

// timedVAs holds VolumeAttachments by name, each with the time it was
// recorded: the shape of both overlays of our writes (created,
// deletedUnseen).
type timedVAs map[string]timedVA

type timedVA struct {
	va *storagev1.VolumeAttachment
	at time.Time
}

// get is the VA of name; nil when there is none.
func (m timedVAs) get(name string) *storagev1.VolumeAttachment {
	return m[name].va
}

// dropIf ends the entry of name if it is the object uid, and reports
// whether it did.
func (m timedVAs) dropIf(name string, uid types.UID) bool {
	if e, ok := m[name]; ok && e.va.UID == uid {
		delete(m, name)
		return true
	}
	return false
}

// older returns name → UID of the entries recorded longer than age before
// now; nil when there are none.
func (m timedVAs) older(now time.Time, age time.Duration) map[string]types.UID {
	var out map[string]types.UID
	for name, e := range m {
		if now.Sub(e.at) > age {
			if out == nil {
				out = map[string]types.UID{}
			}
			out[name] = e.va.UID
		}
	}
	return out
}

// createUncertain records that the create of name ended without a clear
// answer.
func (w *ownWrites) createUncertain(name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.uncertain[name] = struct{}{}
}

// isUncertain reports whether the outcome of our create of name is still
// unknown.
func (w *ownWrites) isUncertain(name string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, ok := w.uncertain[name]
	return ok
}

// settled ends the uncertainty of name: the API server answered (the
// object it has, if any, was handed to createDone).
func (w *ownWrites) settled(name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.uncertain, name)
}

// createStarted is called before the create call of name.
func (w *ownWrites) createStarted(name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.creating[name] = map[types.UID]bool{}
}

// createDone is called when the create call of name returned; va is the
// object the server stored, nil when the call failed. The informer may
// have shown the object, and even its deletion by another client, before
// the call returned: a created object already reported deleted is not
// overlaid, or the key would wait for it forever instead of creating it
// again.
func (w *ownWrites) createDone(name string, va *storagev1.VolumeAttachment, now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	goneMeanwhile := w.creating[name]
	delete(w.creating, name)
	if va == nil || goneMeanwhile[va.UID] {
		return
	}
	w.created[name] = timedVA{va: va, at: now}
	delete(w.deleted, name)
}

// stale returns the entries of overlay (w.created or w.deletedUnseen)
// that the informer has not settled for longer than age (name → UID):
// created VAs no pass has found in the cache (normally none: the informer
// shows a new object within moments), or VAs we deleted before the
// informer showed them that it still has not reported gone.
func (w *ownWrites) stale(overlay timedVAs, now time.Time, age time.Duration) map[string]types.UID {
	w.mu.Lock()
	defer w.mu.Unlock()
	return overlay.older(now, age)
}

// forget ends the entry of name in overlay (w.created or w.deletedUnseen)
// if it still is the object uid: the API server no longer has it, and the
// informer will not say so (it never showed the object, e.g. when it was
// deleted during a watch gap).
func (w *ownWrites) forget(overlay timedVAs, name string, uid types.UID) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return overlay.dropIf(name, uid)
}

// recordDelete is called after our delete of the VA name (uid) returned;
// alreadyGone is true when the server answered NotFound.
func (w *ownWrites) recordDelete(name string, uid types.UID, alreadyGone bool, now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.deleted[name] = uid
	if c := w.created.get(name); c != nil && c.UID == uid && !alreadyGone {
		deleting := c.DeepCopy()
		deleting.DeletionTimestamp = &metav1.Time{Time: now}
		w.deletedUnseen[name] = timedVA{va: deleting, at: now}
	}
	delete(w.created, name)
}

// gone is called for every informer delete.
func (w *ownWrites) gone(va *storagev1.VolumeAttachment) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.deleted, va.Name)
	w.deletedUnseen.dropIf(va.Name, va.UID)
	// Deleted by someone else: the key must create it again. The delete
	// of an older object of the same name (detached and attached again)
	// leaves the new one's entry alone.
	w.created.dropIf(va.Name, va.UID)
	if meanwhile, ok := w.creating[va.Name]; ok {
		meanwhile[va.UID] = true
	}
}

// view returns what the controller should believe about the VA named
// name, given what the lister returned (nil when absent). The returned
// object is shared: never modify it.
func (w *ownWrites) view(name string, listed *storagev1.VolumeAttachment) *storagev1.VolumeAttachment {
	w.mu.Lock()
	defer w.mu.Unlock()
	if listed == nil {
		if d := w.deletedUnseen.get(name); d != nil {
			// Deleted by us before the informer ever showed it: absent
			// from the cache is not gone (see deletedUnseen).
			return d
		}
		// A delete the informer has already shown (or never will: the
		// object was gone before our delete) needs no overlay.
		delete(w.deleted, name)
		return w.created.get(name)
	}
	// The cache has caught up with a create; from now on it is the truth.
	// An object of this name in the cache is also either the one we
	// deleted unseen or proof that it is gone, and it settles a create
	// of unknown outcome.
	delete(w.created, name)
	delete(w.deletedUnseen, name)
	delete(w.uncertain, name)
	if uid, ok := w.deleted[name]; ok && uid == listed.UID && listed.DeletionTimestamp == nil {
		// We deleted it; the informer has not caught up. It is being
		// deleted, not gone: csi-attacher's finalizer keeps it until the
		// driver has unpublished the volume, and until then the volume
		// must still block an exclusive attach to another node.
		// Only the presence of the timestamp matters to the decision.
		deleting := listed.DeepCopy()
		deleting.DeletionTimestamp = &metav1.Time{}
		return deleting
	}
	return listed
}
