package kube

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// Decoder turns what an informer's store holds under a key into T. A
// store filled through a transform may hold placeholders for objects the
// controller never acts on (another driver's): Decode returns ok=false
// for those, or the stand-in T the controller's decisions need. An object
// of an unexpected type is an error.
type Decoder[T metav1.Object] func(obj any) (t T, ok bool, err error)

// OverlaidStore is the one way a controller reads an informer's store: by
// key, through its Decoder (so no placeholder reaches code that expects a
// whole object, as a generated lister's typed Get would hand it) and
// through an OwnWrites overlay (so a pass reads the controller's own
// writes before the watch delivers them). Writes are recorded through it
// too.
//
// The overlay records updates of existing objects; an overlay of creates
// and deletes would add Record variants here (a create has no version
// before it, a delete no version after), with the same readers.
type OverlaidStore[T metav1.Object] struct {
	store  cache.Store
	decode Decoder[T]
	writes *OwnWrites[T]
}

// NewOverlaidStore reads store through decode and a new overlay.
func NewOverlaidStore[T metav1.Object](store cache.Store, decode Decoder[T]) *OverlaidStore[T] {
	return &OverlaidStore[T]{store: store, decode: decode, writes: NewOwnWrites[T]()}
}

// Get returns the freshest known version of the object name: false when
// the store has no object of that name (its overlay entry is dropped then:
// the object is gone) or only a placeholder.
func (s *OverlaidStore[T]) Get(name string) (T, bool, error) {
	var zero T
	obj, exists, err := s.store.GetByKey(name)
	if err != nil {
		return zero, false, err
	}
	if !exists {
		s.writes.Forget(name)
		return zero, false, nil
	}
	t, ok, err := s.decode(obj)
	if err != nil || !ok {
		return zero, false, err
	}
	return s.writes.Resolve(t), true, nil
}

// List returns every object that is not a placeholder, each in its
// freshest known version; what does not decode is left out.
func (s *OverlaidStore[T]) List() []T {
	var out []T
	for _, obj := range s.store.List() {
		if t, ok, err := s.decode(obj); err == nil && ok {
			out = append(out, s.writes.Resolve(t))
		}
	}
	return out
}

// Record notes that the version before of an object was replaced by our
// write written (OwnWrites.RecordIn: a write that deleted the object is
// forgotten at once when the store no longer has it).
func (s *OverlaidStore[T]) Record(before string, written T) {
	s.writes.RecordIn(s.store, before, written)
}

// IsOwn reports whether obj, delivered by the watch, is exactly a version
// we wrote (OwnWrites.IsOwn).
func (s *OverlaidStore[T]) IsOwn(obj T) bool { return s.writes.IsOwn(obj) }

// Forget drops the overlay's entry for name (the object was deleted).
func (s *OverlaidStore[T]) Forget(name string) { s.writes.Forget(name) }

// Len is the number of overlay entries (OwnWrites.Len).
func (s *OverlaidStore[T]) Len() int { return s.writes.Len() }

// Resolve returns the freshest known version of t, an object read from
// the same informer's indexes (which hold what the store holds).
func (s *OverlaidStore[T]) Resolve(t T) T { return s.writes.Resolve(t) }
