package kube

import (
	"testing"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// placeholder stands in a store for an object the reader never acts on.
type placeholder struct{ meta metav1.ObjectMeta }

func (p *placeholder) GetObjectMeta() metav1.Object { return &p.meta }

func decodeTestVA(obj any) (*storagev1.VolumeAttachment, bool, error) {
	switch o := obj.(type) {
	case *storagev1.VolumeAttachment:
		return o, true, nil
	case *placeholder:
		return nil, false, nil
	}
	return nil, false, errUnexpected
}

var errUnexpected = &unexpectedErr{}

type unexpectedErr struct{}

func (*unexpectedErr) Error() string { return "unexpected object" }

func TestOverlaidStore_readsPlaceholdersAsAbsentAndOurWritesFirst(t *testing.T) {
	store := cache.NewStore(cache.MetaNamespaceKeyFunc)
	ours := &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: "ours", ResourceVersion: "5"}}
	for _, o := range []any{ours, &placeholder{meta: metav1.ObjectMeta{Name: "foreign", ResourceVersion: "6"}}} {
		if err := store.Add(o); err != nil {
			t.Fatal(err)
		}
	}
	s := NewOverlaidStore(store, decodeTestVA)

	if va, ok, err := s.Get("foreign"); err != nil || ok || va != nil {
		t.Fatalf("placeholder: Get = %v, %v, %v; want not ours", va, ok, err)
	}
	written := ours.DeepCopy()
	written.ResourceVersion, written.Status.Attached = "7", true
	s.Record("5", written)
	if va, ok, err := s.Get("ours"); err != nil || !ok || !va.Status.Attached {
		t.Fatalf("Get after our write = %+v, %v, %v; want our attached version", va, ok, err)
	}
	if l := s.List(); len(l) != 1 || !l[0].Status.Attached {
		t.Fatalf("List = %+v; want only our VA, in the version we wrote", l)
	}
	if err := store.Delete(ours); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := s.Get("ours"); err != nil || ok {
		t.Fatalf("deleted: Get = %v, %v; want absent", ok, err)
	}
	if s.Len() != 0 {
		t.Fatalf("the overlay keeps %d entries for a deleted object", s.Len())
	}
	if err := store.Add(&storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: "odd"}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Get("odd"); err == nil {
		t.Fatal("an object of an unexpected type read without an error")
	}
}

// informerBetween is a store whose reads let the informer run right after
// they read: it stores the next version and calls the event handler, as
// client-go's informer does (store first, then the handler), and the read
// waits a moment for that handler before it returns.
type informerBetween struct {
	cache.Store
	next    func() // the informer's turn: store the version, call the handler
	pending bool
}

func (s *informerBetween) turn() {
	if !s.pending {
		return
	}
	s.pending = false
	done := make(chan struct{})
	go func() { s.next(); close(done) }()
	select {
	case <-done:
	case <-time.After(200 * time.Millisecond):
		// The handler waits for the reader: it runs once the read is done.
	}
}

func (s *informerBetween) GetByKey(key string) (any, bool, error) {
	obj, exists, err := s.Store.GetByKey(key)
	s.turn()
	return obj, exists, err
}

func (s *informerBetween) List() []any {
	objs := s.Store.List()
	s.turn()
	return objs
}

// Our write's echo is stored and handled (the handler drops our entry, the
// cache now holding our write) between a read of the store and the read of
// the overlay. The read must still give our write, not the version it
// replaced: a pass reading that would send a patch guarded by a stale
// resourceVersion, or find a just-attached volume unattached and publish
// it again. Seen failing while Get and List read the store and the overlay
// apart (the version our write replaced came back).
func TestOverlaidStore_readsOurWriteWhenItsEchoArrivesDuringTheRead(t *testing.T) {
	for _, read := range []string{"Get", "List"} {
		t.Run(read, func(t *testing.T) {
			before := &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: "va", ResourceVersion: "5"}}
			written := before.DeepCopy()
			written.ResourceVersion, written.Status.Attached = "7", true
			echo := written.DeepCopy()
			inner := cache.NewStore(cache.MetaNamespaceKeyFunc)
			if err := inner.Add(before); err != nil {
				t.Fatal(err)
			}
			store := &informerBetween{Store: inner}
			s := NewOverlaidStore(cache.Store(store), decodeTestVA)
			handled := make(chan bool, 1)
			store.next = func() {
				if err := inner.Update(echo); err != nil {
					t.Error(err)
				}
				handled <- s.IsOwnUpdate(before, echo)
			}
			s.Record("5", written)
			store.pending = true

			var got *storagev1.VolumeAttachment
			switch read {
			case "Get":
				va, ok, err := s.Get("va")
				if err != nil || !ok {
					t.Fatalf("Get = %v, %v", ok, err)
				}
				got = va
			case "List":
				l := s.List()
				if len(l) != 1 {
					t.Fatalf("List = %d objects, want 1", len(l))
				}
				got = l[0]
			}
			if got.ResourceVersion != "7" || !got.Status.Attached {
				t.Errorf("%s during the echo = resourceVersion %s, attached %v; want our write (7, attached)", read, got.ResourceVersion, got.Status.Attached)
			}
			if own := <-handled; !own {
				t.Error("the echo of our write was not recognised as ours")
			}
			if va, _, _ := s.Get("va"); va.ResourceVersion != "7" || s.Len() != 0 {
				t.Errorf("after the echo: Get = resourceVersion %s, overlay holds %d entries; want 7 from the cache and none", va.ResourceVersion, s.Len())
			}
		})
	}
}
