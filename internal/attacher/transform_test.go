package attacher

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"

	"github.com/latchcsi/latch/internal/kube"
)

func transformed[T any](t *testing.T, transform func(any) (any, error), obj T) T {
	t.Helper()
	out, err := transform(obj)
	if err != nil {
		t.Fatal(err)
	}
	once := out.(k8sruntime.Object).DeepCopyObject() // the transform may work in place
	again, err := transform(out)
	if err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(again, once) {
		t.Fatalf("transform is not idempotent:\nonce:  %+v\ntwice: %+v", once, again)
	}
	return out.(T)
}

func TestTransformForeignCSIPVKeepsOnlyWhatTheAttacherReads(t *testing.T) {
	transform := Transform(memDriver)
	now := metav1.Now()
	pv := memPV("pv-a", memOtherDriver, 0)
	pv.DeletionTimestamp = &now

	got := transformed(t, transform, pv)
	want := &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pv-a", ResourceVersion: "1", DeletionTimestamp: &now},
		Spec:       v1.PersistentVolumeSpec{PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: memOtherDriver}}},
	}
	if !equality.Semantic.DeepEqual(got, want) {
		t.Fatalf("trimmed PV:\ngot  %+v\nwant %+v", got, want)
	}

	// A VolumeAttachment of ours that names it still learns whose it is.
	_, blocked := volumeFromSpec(got, DriverInfo{Name: memDriver}, nil, "VolumeAttachment \"va\"")
	if blocked == nil || blocked.Reason != ReasonUnsupportedVolume {
		t.Fatalf("blocked = %+v, want %s naming the other driver", blocked, ReasonUnsupportedVolume)
	}
}

func TestTransformSharesOneCSISourcePerForeignDriver(t *testing.T) {
	transform := Transform(memDriver)
	a := transformed(t, transform, memPV("pv-a", memOtherDriver, 0))
	b := transformed(t, transform, memPV("pv-b", memOtherDriver, 1))
	if a.Spec.CSI != b.Spec.CSI {
		t.Fatal("two PVs of the same other driver hold separate CSI sources")
	}
	c := transformed(t, transform, memPV("pv-c", "third.csi.test", 2))
	if c.Spec.CSI == a.Spec.CSI || c.Spec.CSI.Driver != "third.csi.test" {
		t.Fatalf("PV of a third driver got source %+v", c.Spec.CSI)
	}
}

func TestTransformForeignPVWithOurFinalizerKeepsFinalizers(t *testing.T) {
	transform := Transform(memDriver)
	pv := memPV("pv-a", memOtherDriver, 0)
	pv.Finalizers = []string{"kubernetes.io/pv-protection", kube.PVFinalizer(memDriver)}
	got := transformed(t, transform, pv)
	if want := []string{"kubernetes.io/pv-protection", kube.PVFinalizer(memDriver)}; !equality.Semantic.DeepEqual(got.Finalizers, want) {
		t.Fatalf("finalizers = %v, want %v", got.Finalizers, want)
	}

	pv = memPV("pv-b", memOtherDriver, 1)
	got = transformed(t, transform, pv)
	if got.Finalizers != nil {
		t.Fatalf("finalizers of a PV without ours = %v, want none", got.Finalizers)
	}
}

func TestTransformForeignInTreePVIsNotMistakenForOurs(t *testing.T) {
	transform := Transform(memDriver)
	pv := memPV("pv-a", "", 0)
	pv.Spec.CSI = nil
	pv.Spec.HostPath = &v1.HostPathVolumeSource{Path: "/data"}
	got := transformed(t, transform, pv)
	if got.Spec.HostPath != nil || got.Spec.CSI != nil || got.Spec.ClaimRef != nil {
		t.Fatalf("in-tree PV of no driver kept its spec: %+v", got.Spec)
	}
}

func TestTransformMigratedInTreePVStaysWhole(t *testing.T) {
	const gcePD = "pd.csi.storage.gke.io"
	transform := Transform(gcePD)
	pv := memPV("pv-a", "", 0)
	pv.Spec.CSI = nil
	pv.Spec.GCEPersistentDisk = &v1.GCEPersistentDiskVolumeSource{PDName: "disk-1", FSType: "ext4"}
	pv.Labels = map[string]string{"topology.kubernetes.io/zone": "europe-west1-b"}
	want := pv.DeepCopy()
	want.ManagedFields = nil
	delete(want.Annotations, lastAppliedAnnotation)

	got := transformed(t, transform, pv)
	if !equality.Semantic.DeepEqual(got, want) {
		t.Fatalf("migrated PV changed beyond managed fields and last-applied:\ngot  %+v\nwant %+v", got, want)
	}
}

func TestTransformOurPVLosesOnlyManagedFieldsAndLastApplied(t *testing.T) {
	transform := Transform(memDriver)
	pv := memPV("pv-a", memDriver, 0) // even index: has the last-applied annotation
	want := pv.DeepCopy()
	want.ManagedFields = nil
	want.Annotations = map[string]string{"pv.kubernetes.io/provisioned-by": memDriver}

	got := transformed(t, transform, pv)
	if !equality.Semantic.DeepEqual(got, want) {
		t.Fatalf("our PV:\ngot  %+v\nwant %+v", got, want)
	}
}

func TestTransformVolumeAttachmentKeepsAllAnnotations(t *testing.T) {
	// Annotation patches are computed against the cached map: dropping one
	// from the cache could make a patch replace the whole map.
	transform := Transform(memDriver)
	va := &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{
		Name:          "va",
		Annotations:   map[string]string{lastAppliedAnnotation: "{}"},
		ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}},
	}}
	got := transformed(t, transform, va)
	if got.ManagedFields != nil || got.Annotations[lastAppliedAnnotation] != "{}" {
		t.Fatalf("VolumeAttachment metadata = %+v", got.ObjectMeta)
	}
}

func TestTransformCSINodeKeepsOnlyOurDriver(t *testing.T) {
	transform := Transform(memDriver)
	node := memObjects(0, 0, 1)[0].(*storagev1.CSINode)
	got := transformed(t, transform, node)
	if len(got.Spec.Drivers) != 1 || got.Spec.Drivers[0].Name != memDriver || got.Spec.Drivers[0].NodeID != "node-00000-id" {
		t.Fatalf("drivers = %+v, want only %s", got.Spec.Drivers, memDriver)
	}
	if id, ok := csiNodeID(got, memDriver); !ok || id != "node-00000-id" {
		t.Fatalf("csiNodeID = %q, %v", id, ok)
	}

	other := &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: "n"},
		Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{Name: memOtherDriver, NodeID: "x"}}}}
	got = transformed(t, transform, other)
	if len(got.Spec.Drivers) != 0 {
		t.Fatalf("CSINode without our driver kept %+v", got.Spec.Drivers)
	}
	if _, ok := csiNodeID(got, memDriver); ok {
		t.Fatal("CSINode without our driver reports a node ID")
	}
}
