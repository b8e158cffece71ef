package kube

import (
	"fmt"

	"k8s.io/client-go/tools/cache"
)

// Decoder turns what an informer's store holds under a key into T. A
// store filled through a transform may hold placeholders for objects the
// controller never acts on (another driver's): Decode returns ok=false
// for those, or the stand-in T the controller's decisions need. An object
// of an unexpected type is an error.
type Decoder[T Object] func(obj any) (t T, ok bool, err error)

// Typed is the Decoder of a store that holds only whole objects of type T
// (no placeholders).
func Typed[T Object](obj any) (T, bool, error) {
	t, ok := obj.(T)
	if !ok {
		var zero T
		return zero, false, fmt.Errorf("store holds a %T, want a %T", obj, zero)
	}
	return t, true, nil
}

// OverlaidStore is the one way a controller reads an informer's store: by
// key, through its Decoder (so no placeholder reaches code that expects a
// whole object, as a generated lister's typed Get would hand it) and
// through an OwnWrites overlay (so a pass reads the controller's own
// writes before the watch delivers them). Writes are recorded through it
// too: updates (Record), and creates and deletes the informer has not
// shown yet (the OwnWrites methods of ownwrites_unseen.go: CreateStarted,
// CreateDone, Deleted, Gone, …).
type OverlaidStore[T Object] struct {
	store  cache.Store
	decode Decoder[T]
	// The overlay: IsOwn, Forget, Len and the create and delete
	// bookkeeping are its methods.
	*OwnWrites[T]
}

// NewOverlaidStore reads store through decode and a new overlay.
func NewOverlaidStore[T Object](store cache.Store, decode Decoder[T]) *OverlaidStore[T] {
	return &OverlaidStore[T]{store: store, decode: decode, OwnWrites: NewOwnWrites[T]()}
}

// Get returns the freshest known version of the object name: false when
// neither the store nor the overlay has an object of that name (the
// update entry of a name the store no longer has is dropped: the object
// is gone), or the store has only a placeholder. OwnWrites.View says how
// our creates and deletes the store has not shown count.
//
// The store is read under the overlay's lock. The informer updates its
// store before it calls the event handler that drops an entry (IsOwn),
// and the handler takes that lock: so a read either finds the version our
// write replaced with the entry still there, or the written version. Read
// apart, the store could be read just before the informer stored our
// write and the overlay just after the handler dropped its entry, and a
// pass would see the version our write replaced: a guarded patch built on
// it fails, and a VolumeAttachment just marked attached would read as not
// attached. Nothing the informer does waits for this lock, so holding it
// across the read cannot deadlock.
func (s *OverlaidStore[T]) Get(name string) (T, bool, error) {
	var zero T
	s.mu.Lock()
	defer s.mu.Unlock()
	obj, exists, err := s.store.GetByKey(name)
	if err != nil {
		return zero, false, err
	}
	if !exists {
		t, ok := s.viewLocked(name, zero, false)
		return t, ok, nil
	}
	t, ok, err := s.decode(obj)
	if err != nil || !ok {
		return zero, false, err
	}
	t, _ = s.viewLocked(name, t, true)
	return t, true, nil
}

// List returns every object the store holds that is not a placeholder,
// each in its freshest known version (updates only: creates and deletes
// the store has not shown are not listed); what does not decode is left
// out. The store is listed under the overlay's lock, as Get reads it.
func (s *OverlaidStore[T]) List() []T {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []T
	for _, obj := range s.store.List() {
		if t, ok, err := s.decode(obj); err == nil && ok {
			out = append(out, s.resolveLocked(t))
		}
	}
	return out
}

// Record notes that the version before of an object was replaced by our
// write written (OwnWrites.RecordIn: a write that deleted the object is
// forgotten at once when the store no longer has it).
func (s *OverlaidStore[T]) Record(before string, written T) {
	s.RecordIn(s.store, before, written)
}
