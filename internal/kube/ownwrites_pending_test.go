package kube

import (
	"errors"
	"testing"

	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
)

const attachedPatch = `{"metadata":{"uid":"u1"},"status":{"attached":true}}`

func pendingVA(rv string, attached bool) *storagev1.VolumeAttachment {
	va := vaAt(rv, attached)
	va.UID = "u1"
	return va
}

// newPendingStore is an overlay over an empty store (only the overlay's
// bookkeeping is under test).
func newPendingStore() *OverlaidStore[*storagev1.VolumeAttachment] {
	return NewOverlaidStore(cache.NewStore(cache.MetaNamespaceKeyFunc), Typed[*storagev1.VolumeAttachment])
}

// The watch delivers our status write (10 → 11) while its call is still in
// flight: it is ours, and once the call returns nothing is left overlaid.
func TestOwnWrites_echoBeforeTheAnswerIsOwn(t *testing.T) {
	s := newPendingStore()
	before := pendingVA("10", false)
	var during bool
	written, err := s.Patch(before, types.MergePatchType, []byte(attachedPatch), func() (*storagev1.VolumeAttachment, error) {
		during = s.IsOwnUpdate(before, pendingVA("11", true))
		return pendingVA("11", true), nil
	})
	if err != nil || written.ResourceVersion != "11" {
		t.Fatalf("Patch = %v, %v", written, err)
	}
	if !during {
		t.Errorf("the echo delivered before the answer was not recognised")
	}
	if s.Len() != 0 {
		t.Errorf("overlay entries after an echo that came first = %d, want 0", s.Len())
	}
	// The answer came first: the echo is recognised as before.
	if _, err := s.Patch(pendingVA("11", true), types.MergePatchType, []byte(`{"metadata":{"uid":"u1"},"status":{"attached":false}}`),
		func() (*storagev1.VolumeAttachment, error) { return pendingVA("12", false), nil }); err != nil {
		t.Fatal(err)
	}
	if !s.IsOwnUpdate(pendingVA("11", true), pendingVA("12", false)) {
		t.Errorf("the echo delivered after the answer was not recognised")
	}
}

// Only the version our patch makes of the version it was sent against is
// ours: another client's write in between (a deletion), one on top of ours,
// one of another object of that name, and any event after a failed call
// are not.
func TestOwnWrites_otherWritesDuringOurCallAreNotOwn(t *testing.T) {
	s := newPendingStore()
	before := pendingVA("10", false)
	deletingVA := func(rv string, attached bool) *storagev1.VolumeAttachment {
		va := pendingVA(rv, attached)
		va.DeletionTimestamp = &metav1.Time{}
		return va
	}
	replaced := pendingVA("11", true)
	replaced.UID = "u2"
	_, _ = s.Patch(before, types.MergePatchType, []byte(attachedPatch), func() (*storagev1.VolumeAttachment, error) {
		for _, c := range []struct {
			what     string
			old, obj *storagev1.VolumeAttachment
		}{
			{"a deletion of the version we patched", before, deletingVA("11", false)},
			{"a deletion on top of our write", pendingVA("11", true), deletingVA("12", true)},
			{"another object of the same name", before, replaced},
			{"an add", nil, pendingVA("11", true)},
		} {
			if s.IsOwnUpdate(c.old, c.obj) {
				t.Errorf("%s counted as our write", c.what)
			}
		}
		return deletingVA("12", true), nil
	})

	_, err := s.Patch(pendingVA("20", false), types.MergePatchType, []byte(attachedPatch), func() (*storagev1.VolumeAttachment, error) {
		return nil, errors.New("timeout")
	})
	if err == nil {
		t.Fatal("Patch hid the call's error")
	}
	if s.IsOwnUpdate(pendingVA("20", false), pendingVA("21", true)) {
		t.Errorf("a version made after our call failed counted as ours")
	}
}

// A JSON patch (our finalizer and annotation writes) is recognised the
// same way, and only as an update of the version it was sent against.
func TestOwnWrites_pendingJSONPatchMatchesOnlyTheVersionItWasSentAgainst(t *testing.T) {
	s := newPendingStore()
	before := pendingVA("10", false)
	patch := []byte(`[{"op":"test","path":"/metadata/resourceVersion","value":"10"},{"op":"add","path":"/metadata/finalizers","value":["f"]}]`)
	withFinalizer := func(rv string) *storagev1.VolumeAttachment {
		va := pendingVA(rv, false)
		va.Finalizers = []string{"f"}
		return va
	}
	_, _ = s.Patch(before, types.JSONPatchType, patch, func() (*storagev1.VolumeAttachment, error) {
		if s.IsOwnUpdate(pendingVA("9", false), withFinalizer("11")) {
			t.Errorf("an update from another version counted as our write")
		}
		if !s.IsOwnUpdate(before, withFinalizer("11")) {
			t.Errorf("our JSON patch's echo not recognised")
		}
		return withFinalizer("11"), nil
	})
	if s.Len() != 0 {
		t.Errorf("overlay entries = %d, want 0", s.Len())
	}
}

// A call that panics ends its expectation too: nothing made later is
// taken for that write.
func TestOwnWrites_panickingCallWithdrawsItsExpectation(t *testing.T) {
	s := newPendingStore()
	before := pendingVA("10", false)
	func() {
		defer func() { _ = recover() }()
		_, _ = s.Patch(before, types.MergePatchType, []byte(attachedPatch), func() (*storagev1.VolumeAttachment, error) {
			panic("transport")
		})
	}()
	if s.IsOwnUpdate(before, pendingVA("11", true)) {
		t.Errorf("a version made after the call panicked counted as ours")
	}
	if n := len(s.pending); n != 0 {
		t.Errorf("expectations left = %d, want 0", n)
	}
}
