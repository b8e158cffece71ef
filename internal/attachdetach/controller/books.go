package controller

import (
	"sync"

	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/latchcsi/latch/internal/attachdetach/state"
)

// nameBook maps VolumeAttachment names to the keys they belong to, so a
// VolumeAttachment event is routed without resolving its PV. Names are
// registered whenever a key is reconciled or rebuilt, and dropped when a
// pass finds the key neither wanted nor attached and its VolumeAttachment
// gone (forgetIf), so the book holds one name per live key rather than
// every name ever seen. A name the book does not know goes through the VA
// queue, which resolves it.
type nameBook struct {
	mu    sync.Mutex
	names map[string]state.Key
}

func newNameBook() *nameBook { return &nameBook{names: map[string]state.Key{}} }

func (b *nameBook) set(name string, key state.Key) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.names[name] = key
}

// forgetIf drops name if it still maps to key and unused reports true;
// unused runs under the book's lock. Whoever makes a key live again (an
// adopted VolumeAttachment) records it in the actual state before calling
// set, so either unused sees the entry or set comes after the drop.
func (b *nameBook) forgetIf(name string, key state.Key, unused func() bool) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if k, ok := b.names[name]; !ok || k != key || !unused() {
		return false
	}
	delete(b.names, name)
	return true
}

func (b *nameBook) len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.names)
}

func (b *nameBook) get(name string) (state.Key, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	k, ok := b.names[name]
	return k, ok
}

// ownWrites overlays the VolumeAttachment informer with the controller's
// own writes until the informer shows them, so that a pass right after a
// create does not see "no VolumeAttachment" and a pass right after a
// delete sees the deleted one as being deleted, not as a live attachment
// (which could put a volume being detached back into the node's
// volumesAttached) and not as gone (which would let an exclusive volume
// attach to another node before the driver unpublished it here).
type ownWrites struct {
	mu sync.Mutex
	// created holds VAs created by us that the informer has not shown.
	created map[string]*storagev1.VolumeAttachment
	// deleted holds the UIDs of VAs deleted by us that the informer still
	// shows.
	deleted map[string]types.UID
}

func newOwnWrites() *ownWrites {
	return &ownWrites{created: map[string]*storagev1.VolumeAttachment{}, deleted: map[string]types.UID{}}
}

func (w *ownWrites) recordCreate(va *storagev1.VolumeAttachment) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.created[va.Name] = va
	delete(w.deleted, va.Name)
}

func (w *ownWrites) recordDelete(name string, uid types.UID) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.deleted[name] = uid
	delete(w.created, name)
}

// observed is called for every informer add/update: the informer has
// caught up with a create.
func (w *ownWrites) observed(va *storagev1.VolumeAttachment) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.created, va.Name)
}

// gone is called for every informer delete.
func (w *ownWrites) gone(name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.created, name)
	delete(w.deleted, name)
}

// view returns what the controller should believe about the VA named
// name, given what the lister returned (nil when absent). The returned
// object is shared: never modify it.
func (w *ownWrites) view(name string, listed *storagev1.VolumeAttachment) *storagev1.VolumeAttachment {
	w.mu.Lock()
	defer w.mu.Unlock()
	if listed == nil {
		// A delete the informer has already shown (or never will: the
		// object was gone before our delete) needs no overlay.
		delete(w.deleted, name)
		return w.created[name]
	}
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
