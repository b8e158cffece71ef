package kube

import (
	"testing"

	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// echoVA is a VolumeAttachment as the attacher caches one of its own,
// with managed fields as the watch delivers them.
func echoVA(rv string) *storagev1.VolumeAttachment {
	pv := "pv-0001"
	return &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{
			Name: "csi-4f1c0e5d2b9a8c7e6f5d4c3b2a1908f7e6d5c4b3a29180f7e6d5c4b3a2918", UID: "8d6f1c52-3e0b-4b7e-9a51-0c7d2f3e4a5b",
			ResourceVersion: rv, CreationTimestamp: metav1.Unix(1795000000, 0),
			Annotations: map[string]string{"csi.alpha.kubernetes.io/node-id": "node-7"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate,
				APIVersion: "storage.k8s.io/v1", FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:spec":{"f:attacher":{},"f:nodeName":{},"f:source":{"f:persistentVolumeName":{}}}}`)}}},
		},
		Spec: storagev1.VolumeAttachmentSpec{Attacher: "csi.example.com", NodeName: "node-7",
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv}},
	}
}

// statusPatchEcho returns a status patch of before to status and the
// object the API server answers it with (resourceVersion 11).
func statusPatchEcho(tb testing.TB, before *storagev1.VolumeAttachment, status storagev1.VolumeAttachmentStatus) ([]byte, *storagev1.VolumeAttachment) {
	tb.Helper()
	patch, err := VolumeAttachmentStatusPatch(before, status)
	if err != nil {
		tb.Fatal(err)
	}
	after := before.DeepCopy()
	after.ResourceVersion = "11"
	after.Status = status
	return patch, after
}

// BenchmarkIsOwnUpdatePendingEcho is the informer's echo of a write of
// ours that arrives while its call is in flight (the usual order in an
// attach burst): the status patch applied to the cached version is
// compared with the delivered one.
func BenchmarkIsOwnUpdatePendingEcho(b *testing.B) {
	s := newPendingStore()
	before := echoVA("10")
	before.Finalizers = []string{"external-attacher/csi-example-com"}
	patch, after := statusPatchEcho(b, before, storagev1.VolumeAttachmentStatus{Attached: true, AttachmentMetadata: map[string]string{"devicePath": "/dev/xvdba"}})
	after.ManagedFields = append(after.ManagedFields, metav1.ManagedFieldsEntry{Manager: "csi-attacher", Operation: metav1.ManagedFieldsOperationUpdate, Subresource: "status"})
	b.ReportAllocs()
	for b.Loop() {
		var own bool
		if _, err := s.Patch(before, types.MergePatchType, patch, func() (*storagev1.VolumeAttachment, error) {
			own = s.IsOwnUpdate(before, after)
			return after, nil
		}); err != nil || !own {
			b.Fatalf("echo not recognised (err %v)", err)
		}
	}
}

// Recognising an echo reads the informer's object without changing it:
// it is the cached object every other reader sees.
func TestOwnWrites_pendingEchoLeavesTheDeliveredObjectAsItIs(t *testing.T) {
	s := newPendingStore()
	before := echoVA("10")
	patch, after := statusPatchEcho(t, before, storagev1.VolumeAttachmentStatus{Attached: true})
	delivered := after.DeepCopy()
	var own bool
	if _, err := s.Patch(before, types.MergePatchType, patch, func() (*storagev1.VolumeAttachment, error) {
		own = s.IsOwnUpdate(before, delivered)
		return after, nil
	}); err != nil {
		t.Fatal(err)
	}
	if !own {
		t.Fatal("the echo of our status patch was not recognised")
	}
	if delivered.ResourceVersion != "11" || len(delivered.ManagedFields) != 1 || !delivered.Status.Attached {
		t.Errorf("the delivered object changed: resourceVersion %q, %d managed fields, attached %v", delivered.ResourceVersion, len(delivered.ManagedFields), delivered.Status.Attached)
	}
}
