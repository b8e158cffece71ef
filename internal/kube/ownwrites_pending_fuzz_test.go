package kube

import (
	"encoding/json"
	"testing"
	"unicode/utf8"

	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// FuzzOwnWrites_pendingEchoIsOursAndNothingElse: while our status patch of
// a VolumeAttachment is in flight, the version it makes of the version it
// was sent against is recognised as ours, and another client's version of
// that same version (attached flipped, another detach error, finalizers
// gone, a deletion) is not, unless it leaves the object exactly as ours
// does (the naive reference: the two objects compared field by field).
func FuzzOwnWrites_pendingEchoIsOursAndNothingElse(f *testing.F) {
	f.Add(false, true, "external-attacher/x", uint8(0), "rpc error: code = Internal")
	f.Add(true, true, "", uint8(1), "")
	f.Add(true, false, "f", uint8(3), "m")
	f.Fuzz(func(t *testing.T, attachedBefore, attachedOurs bool, finalizer string, otherKind uint8, msg string) {
		if !utf8.ValidString(msg) || !utf8.ValidString(finalizer) {
			return // the API server stores only UTF-8
		}
		old := pendingVA("10", attachedBefore)
		old.Finalizers = []string{finalizer}
		patch, err := json.Marshal(map[string]any{
			"metadata": map[string]any{"uid": old.UID},
			"status":   map[string]any{"attached": attachedOurs, "detachError": map[string]any{"message": msg}},
		})
		if err != nil {
			t.Fatal(err)
		}
		ours := old.DeepCopy()
		ours.ResourceVersion = "11"
		ours.Status.Attached = attachedOurs
		ours.Status.DetachError = &storagev1.VolumeError{Message: msg}
		other := old.DeepCopy()
		other.ResourceVersion = "11"
		switch otherKind % 4 {
		case 0:
			other.Status.Attached = !attachedBefore
		case 1:
			other.Status.DetachError = &storagev1.VolumeError{Message: msg + "!"}
		case 2:
			other.Finalizers = nil
		case 3:
			other.DeletionTimestamp = &metav1.Time{}
		}
		sameAsOurs := equality.Semantic.DeepEqual(other, ours)

		s := newPendingStore()
		_, _ = s.Patch(old, types.MergePatchType, patch, func() (*storagev1.VolumeAttachment, error) {
			if got := s.IsOwnUpdate(old, other); got != sameAsOurs {
				t.Fatalf("another client's version (kind %d) counted as ours: %v, want %v", otherKind%4, got, sameAsOurs)
			}
			if !sameAsOurs && !s.IsOwnUpdate(old, ours) {
				t.Fatalf("our write's echo not recognised")
			}
			return ours, nil
		})
		if s.Len() != 0 {
			t.Fatalf("overlay entries after the echo = %d, want 0", s.Len())
		}
	})
}
