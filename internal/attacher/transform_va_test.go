package attacher

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"
	"unsafe"

	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/attacher/decide"
	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// ourVA is a VolumeAttachment of memDriver as protobuf decoding gives it:
// every string its own copy; labels, an owner reference, managed fields,
// kubectl's last-applied annotation beside the attacher's, another
// finalizer beside ours, an attached status with attachment metadata.
func ourVA(mutate func(*storagev1.VolumeAttachment)) *storagev1.VolumeAttachment {
	own := strings.Clone
	pvName := "pv-a"
	grace := int64(30)
	va := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{
			Name: "csi-0123", UID: "va-uid", ResourceVersion: "41", GenerateName: "csi-",
			CreationTimestamp:          metav1.NewTime(time.Date(2026, 11, 26, 8, 0, 0, 0, time.UTC)),
			DeletionGracePeriodSeconds: &grace,
			Labels:                     map[string]string{"team": "a"},
			OwnerReferences:            []metav1.OwnerReference{{Kind: "Pod", Name: "app", UID: "app-uid"}},
			ManagedFields:              []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager"}},
			Annotations: map[string]string{
				own(kubenames.VANodeIDAnnotation): "node-a-id",
				own(AnnVolumeHandle):              "vol-pv-a",
				own(AnnSecretRef):                 "ns/publish",
				lastAppliedAnnotation:             `{"kind":"VolumeAttachment"}`,
			},
			Finalizers: []string{"example.com/keep", own(kubenames.AttacherFinalizer(memDriver))},
		},
		Spec: storagev1.VolumeAttachmentSpec{Attacher: own(memDriver), NodeName: "node-a",
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pvName}},
		Status: storagev1.VolumeAttachmentStatus{Attached: true, AttachmentMetadata: map[string]string{"devicePath": "/dev/xvdb"}},
	}
	if mutate != nil {
		mutate(va)
	}
	return va
}

// Our VolumeAttachment, trimmed, gives the attacher the same decisions and
// the same writes as whole: the attach and detach plans, the ListVolumes
// repair, and every patch computed against it (finalizer, annotations,
// status) are byte for byte the same. Only labels, owner references,
// generateName and deletionGracePeriodSeconds go; the strings every
// VolumeAttachment of ours repeats are one shared copy.
func TestTransformOurVolumeAttachmentKeepsWhatWritesAreComputedFrom(t *testing.T) {
	deleted := metav1.NewTime(time.Date(2026, 11, 26, 8, 5, 0, 0, time.UTC))
	for _, tc := range []struct {
		name string
		va   *storagev1.VolumeAttachment
	}{
		{"attached", ourVA(nil)},
		{"new: no annotations of ours yet, only kubectl's", ourVA(func(va *storagev1.VolumeAttachment) {
			va.Annotations = map[string]string{lastAppliedAnnotation: "{}"}
			va.Finalizers = nil
			va.Status = storagev1.VolumeAttachmentStatus{}
		})},
		{"new: no annotations at all", ourVA(func(va *storagev1.VolumeAttachment) {
			va.Annotations, va.Finalizers, va.Status = nil, nil, storagev1.VolumeAttachmentStatus{}
		})},
		{"attach failed", ourVA(func(va *storagev1.VolumeAttachment) {
			va.Status = storagev1.VolumeAttachmentStatus{AttachError: &storagev1.VolumeError{Message: "denied", Time: deleted}}
		})},
		{"deleting, detach failed", ourVA(func(va *storagev1.VolumeAttachment) {
			va.DeletionTimestamp = &deleted
			va.Status.DetachError = &storagev1.VolumeError{Message: "busy", Time: deleted}
		})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			whole := tc.va.DeepCopy()
			whole.ManagedFields = nil // dropped from every object, as before
			got := transformed[*storagev1.VolumeAttachment](t, Transform(memDriver), tc.va)

			want := whole.DeepCopy()
			want.Labels, want.OwnerReferences, want.GenerateName, want.DeletionGracePeriodSeconds = nil, nil, "", nil
			if !equality.Semantic.DeepEqual(got, want) {
				t.Errorf("trimmed:\ngot  %+v\nwant %+v", got, want)
			}

			pv := memPV("pv-a", memDriver, 1)
			csiNode := &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: "node-a"},
				Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{Name: memDriver, NodeID: "node-a-id"}}}}
			drv := DriverInfo{Name: memDriver}
			for _, obs := range []decide.Observed{{PV: pv, CSINode: csiNode}, {CSINode: csiNode}, {PV: pv}, {PV: pv, CSINode: csiNode, StillPublished: true}} {
				w, g := obs, obs
				w.VA, g.VA = whole, got
				if a, b := decide.Attach(g, drv, nil), decide.Attach(w, drv, nil); !equality.Semantic.DeepEqual(a, b) {
					t.Errorf("attach plan trimmed %+v, whole %+v", a, b)
				}
				if a, b := decide.Detach(g, drv, nil), decide.Detach(w, drv, nil); !equality.Semantic.DeepEqual(a, b) {
					t.Errorf("detach plan trimmed %+v, whole %+v", a, b)
				}
			}
			for _, published := range []bool{false, true} {
				if a, b := decide.RepairFor(got, published, memDriver), decide.RepairFor(whole, published, memDriver); a != b {
					t.Errorf("repair (published %v) trimmed %q, whole %q", published, a, b)
				}
			}

			same := func(what string, build func(*storagev1.VolumeAttachment) ([]byte, error)) {
				t.Helper()
				a, errA := build(got)
				b, errB := build(whole)
				if !bytes.Equal(a, b) || fmt.Sprint(errA) != fmt.Sprint(errB) {
					t.Errorf("%s: trimmed %s (%v), whole %s (%v)", what, a, errA, b, errB)
				}
			}
			for _, mc := range []decide.MetadataChange{
				{AddFinalizer: kubenames.AttacherFinalizer(memDriver)},
				{SetAnnotations: map[string]string{kubenames.VANodeIDAnnotation: "node-a-id-2", AnnVolumeHandle: "vol-pv-a"}},
				{AddFinalizer: kubenames.AttacherFinalizer(memDriver), SetAnnotations: map[string]string{kubenames.VANodeIDAnnotation: "node-a-id"}},
			} {
				same(fmt.Sprintf("metadata patch %+v", mc), func(va *storagev1.VolumeAttachment) ([]byte, error) { return metadataPatch(va, &mc) })
			}
			same("finalizer removal", func(va *storagev1.VolumeAttachment) ([]byte, error) {
				return kube.RemoveFinalizerPatch(va, kubenames.AttacherFinalizer(memDriver))
			})
			for _, status := range []storagev1.VolumeAttachmentStatus{
				{Attached: true, AttachmentMetadata: whole.Status.AttachmentMetadata},
				{Attached: true, AttachmentMetadata: map[string]string{"devicePath": "/dev/xvdc"}},
				{Attached: false},
				{AttachError: &storagev1.VolumeError{Message: "denied", Time: deleted}},
			} {
				same(fmt.Sprintf("status patch to %+v", status), func(va *storagev1.VolumeAttachment) ([]byte, error) {
					return kube.VolumeAttachmentStatusPatch(va, status)
				})
			}
		})
	}
}

// The strings every VolumeAttachment of ours repeats are one copy for all
// of them once transformed: spec.attacher, our finalizer and the keys of
// the attacher's annotations.
func TestTransformOurVolumeAttachmentsShareRepeatedStrings(t *testing.T) {
	transform := Transform(memDriver)
	a := transformed[*storagev1.VolumeAttachment](t, transform, ourVA(nil))
	b := transformed[*storagev1.VolumeAttachment](t, transform, ourVA(nil))
	sharedData := func(what, x, y string) {
		t.Helper()
		if x != y || unsafe.StringData(x) != unsafe.StringData(y) {
			t.Errorf("%s: %q and %q are two copies", what, x, y)
		}
	}
	sharedData("spec.attacher", a.Spec.Attacher, b.Spec.Attacher)
	sharedData("our finalizer", a.Finalizers[1], b.Finalizers[1])
	for _, key := range []string{kubenames.VANodeIDAnnotation, AnnVolumeHandle, AnnSecretRef} {
		found := 0
		for ka := range a.Annotations {
			for kb := range b.Annotations {
				if ka == key && kb == key {
					sharedData("annotation key "+key, ka, kb)
					found++
				}
			}
		}
		if found != 1 {
			t.Errorf("annotation %s missing", key)
		}
	}
	if a.Annotations[lastAppliedAnnotation] == "" || a.Finalizers[0] != "example.com/keep" {
		t.Errorf("other annotations or finalizers lost: %+v", a.ObjectMeta)
	}
}
