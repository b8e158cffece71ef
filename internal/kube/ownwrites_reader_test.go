package kube

import (
	"testing"

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
