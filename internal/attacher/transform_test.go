package attacher

import (
	"strings"
	"testing"
	"unsafe"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"

	"github.com/latchcsi/latch/internal/attacher/decide"
	"github.com/latchcsi/latch/internal/kube/kubenames"
)

func transformed[T any](t *testing.T, transform func(any) (any, error), obj any) T {
	t.Helper()
	out, err := transform(obj)
	if err != nil {
		t.Fatal(err)
	}
	var once any
	if o, ok := out.(k8sruntime.Object); ok {
		once = o.DeepCopyObject() // the transform may work in place
	} else if f, ok := out.(*ForeignPV); ok {
		c := *f
		once = &c
	} else if f, ok := out.(*ForeignVA); ok {
		c := *f
		once = &c
	}
	again, err := transform(out)
	if err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(again, once) {
		t.Fatalf("transform is not idempotent:\nonce:  %+v\ntwice: %+v", once, again)
	}
	got, ok := out.(T)
	if !ok {
		t.Fatalf("transform returned %T, want %T", out, got)
	}
	return got
}

func TestTransformForeignCSIPVBecomesAPlaceholder(t *testing.T) {
	transform := Transform(memDriver)
	now := metav1.Now()
	pv := memPV("pv-a", memOtherDriver, 0)
	pv.DeletionTimestamp = &now

	got := transformed[*ForeignPV](t, transform, pv)
	want := &ForeignPV{Name: "pv-a", ResourceVersion: "1", Driver: memOtherDriver, DeletionTimestamp: &now}
	if !equality.Semantic.DeepEqual(got, want) {
		t.Fatalf("placeholder:\ngot  %+v\nwant %+v", got, want)
	}
	// client-go's store keys it and reads its resourceVersion.
	if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(got); err != nil || key != "pv-a" {
		t.Fatalf("key = %q, %v; want pv-a", key, err)
	}
	if acc, err := meta.Accessor(got); err != nil || acc.GetResourceVersion() != "1" {
		t.Fatalf("accessor = %v, %v; want resourceVersion 1", acc, err)
	}
}

func TestLookupPVOfAPlaceholderTellsAVolumeAttachmentWhoseItIs(t *testing.T) {
	transform := Transform(memDriver)
	store := cache.NewStore(cache.DeletionHandlingMetaNamespaceKeyFunc)
	for _, pv := range []*v1.PersistentVolume{memPV("pv-other", memOtherDriver, 0), memPV("pv-ours", memDriver, 1)} {
		obj, err := transform(pv)
		if err != nil {
			t.Fatal(err)
		}
		if err := store.Add(obj); err != nil {
			t.Fatal(err)
		}
	}

	other, err := LookupPV(store, "pv-other")
	if err != nil {
		t.Fatal(err)
	}
	_, blocked := decide.ResolveVolume(other, DriverInfo{Name: memDriver}, nil, "VolumeAttachment \"va\"")
	if blocked == nil || blocked.Reason != decide.ReasonUnsupportedVolume || !strings.Contains(blocked.Message, memOtherDriver) {
		t.Fatalf("blocked = %+v, want %s naming %s", blocked, decide.ReasonUnsupportedVolume, memOtherDriver)
	}

	ours, err := LookupPV(store, "pv-ours")
	if err != nil || ours.Spec.CSI == nil || ours.Spec.CSI.VolumeHandle == "" {
		t.Fatalf("our PV = %+v, %v; want it whole", ours, err)
	}

	if _, err := LookupPV(store, "pv-missing"); !apierrors.IsNotFound(err) {
		t.Fatalf("missing PV: err = %v, want NotFound", err)
	}
}

func TestTransformSharesOneDriverNamePerForeignDriver(t *testing.T) {
	transform := Transform(memDriver)
	a := transformed[*ForeignPV](t, transform, memPV("pv-a", memOtherDriver, 0))
	b := transformed[*ForeignPV](t, transform, memPV("pv-b", memOtherDriver, 1))
	if unsafe.StringData(a.Driver) != unsafe.StringData(b.Driver) {
		t.Fatal("two placeholders of the same other driver hold separate driver names")
	}
	c := transformed[*ForeignPV](t, transform, memPV("pv-c", "third.csi.test", 2))
	if c.Driver != "third.csi.test" {
		t.Fatalf("placeholder of a third driver names %q", c.Driver)
	}
}

func TestTransformForeignPVWithOurFinalizerKeepsFinalizers(t *testing.T) {
	transform := Transform(memDriver)
	pv := memPV("pv-a", memOtherDriver, 0)
	pv.Finalizers = []string{"kubernetes.io/pv-protection", kubenames.PVFinalizer(memDriver)}
	got := transformed[*v1.PersistentVolume](t, transform, pv)
	if want := []string{"kubernetes.io/pv-protection", kubenames.PVFinalizer(memDriver)}; !equality.Semantic.DeepEqual(got.Finalizers, want) {
		t.Fatalf("finalizers = %v, want %v", got.Finalizers, want)
	}
	want := &v1.CSIPersistentVolumeSource{Driver: memOtherDriver}
	if !equality.Semantic.DeepEqual(got.Spec.CSI, want) || got.Spec.ClaimRef != nil || got.UID != "" {
		t.Fatalf("trimmed PV kept more than it needs: %+v", got)
	}

	// Once our finalizer is gone it becomes a placeholder.
	pv = memPV("pv-b", memOtherDriver, 1)
	pv.Finalizers = []string{"kubernetes.io/pv-protection"}
	transformed[*ForeignPV](t, transform, pv)
}

func TestTransformForeignInTreePVIsNotMistakenForOurs(t *testing.T) {
	transform := Transform(memDriver)
	pv := memPV("pv-a", "", 0)
	pv.Spec.CSI = nil
	pv.Spec.HostPath = &v1.HostPathVolumeSource{Path: "/data"}
	got := transformed[*ForeignPV](t, transform, pv)
	if got.Driver != "" {
		t.Fatalf("in-tree PV of no driver got driver %q", got.Driver)
	}
	if p := got.PV(); p.Spec.CSI != nil {
		t.Fatalf("in-tree PV of no driver looks like a CSI PV: %+v", p.Spec)
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

	got := transformed[*v1.PersistentVolume](t, transform, pv)
	if !equality.Semantic.DeepEqual(got, want) {
		t.Fatalf("migrated PV changed beyond managed fields and last-applied:\ngot  %+v\nwant %+v", got, want)
	}
}

func TestTransformOurCSIPVKeepsOnlyWhatTheAttachReads(t *testing.T) {
	transform := Transform(memDriver)
	now := metav1.Now()
	block := v1.PersistentVolumeBlock
	pv := memPV("pv-a", memDriver, 0) // managed fields, annotations, claim reference, capacity
	pv.DeletionTimestamp = &now
	pv.Finalizers = []string{"kubernetes.io/pv-protection", kubenames.PVFinalizer(memDriver)}
	pv.Labels = map[string]string{"team": "a"}
	pv.Spec.VolumeMode = &block
	pv.Spec.MountOptions = []string{"noatime"}
	pv.Spec.CSI.VolumeAttributes = map[string]string{"tier": "fast"}
	pv.Spec.CSI.ControllerPublishSecretRef = &v1.SecretReference{Namespace: "ns", Name: "s"}
	pv.Status.Phase = v1.VolumeBound
	want := &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pv-a", ResourceVersion: pv.ResourceVersion, DeletionTimestamp: &now,
			Finalizers: []string{"kubernetes.io/pv-protection", kubenames.PVFinalizer(memDriver)}},
		Spec: v1.PersistentVolumeSpec{
			PersistentVolumeSource: v1.PersistentVolumeSource{CSI: pv.Spec.CSI.DeepCopy()},
			AccessModes:            pv.Spec.AccessModes,
			VolumeMode:             &block,
			MountOptions:           []string{"noatime"},
		},
	}

	got := transformed[*v1.PersistentVolume](t, transform, pv)
	if !equality.Semantic.DeepEqual(got, want) {
		t.Fatalf("our PV:\ngot  %+v\nwant %+v", got, want)
	}
	// What ControllerPublish gets from it is unchanged.
	vol, blocked := decide.ResolveVolume(got, DriverInfo{Name: memDriver}, nil, "VolumeAttachment \"va\"")
	if blocked != nil || vol.Handle != pv.Spec.CSI.VolumeHandle || vol.Secret == nil || !vol.Block || vol.VolumeContext["tier"] != "fast" || len(vol.MountOptions) != 1 {
		t.Fatalf("volume from the trimmed PV = %+v, %+v", vol, blocked)
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
	}, Spec: storagev1.VolumeAttachmentSpec{Attacher: memDriver}}
	got := transformed[*storagev1.VolumeAttachment](t, transform, va)
	if got.ManagedFields != nil || got.Annotations[lastAppliedAnnotation] != "{}" {
		t.Fatalf("VolumeAttachment metadata = %+v", got.ObjectMeta)
	}
}

func TestTransformCSINodeKeepsOnlyOurDriver(t *testing.T) {
	transform := Transform(memDriver)
	node := memObjects(0, 0, 1)[0].(*storagev1.CSINode)
	got := transformed[*storagev1.CSINode](t, transform, node)
	if len(got.Spec.Drivers) != 1 || got.Spec.Drivers[0].Name != memDriver || got.Spec.Drivers[0].NodeID != "node-00000-id" {
		t.Fatalf("drivers = %+v, want only %s", got.Spec.Drivers, memDriver)
	}
	if id, ok := decide.CSINodeID(got, memDriver); !ok || id != "node-00000-id" {
		t.Fatalf("csiNodeID = %q, %v", id, ok)
	}

	other := &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: "n"},
		Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{Name: memOtherDriver, NodeID: "x"}}}}
	got = transformed[*storagev1.CSINode](t, transform, other)
	if len(got.Spec.Drivers) != 0 {
		t.Fatalf("CSINode without our driver kept %+v", got.Spec.Drivers)
	}
	if _, ok := decide.CSINodeID(got, memDriver); ok {
		t.Fatal("CSINode without our driver reports a node ID")
	}
}

func TestTransformOtherAttachersVolumeAttachmentBecomesAPlaceholder(t *testing.T) {
	transform := Transform(memDriver)
	pvName := "pv-a"
	va := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: "va-other", ResourceVersion: "7", Finalizers: []string{"external-attacher/" + memOtherDriver}},
		Spec: storagev1.VolumeAttachmentSpec{Attacher: memOtherDriver, NodeName: "node-a",
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pvName}},
		Status: storagev1.VolumeAttachmentStatus{Attached: true},
	}
	got := transformed[*ForeignVA](t, transform, va)
	if want := (&ForeignVA{Name: "va-other", ResourceVersion: "7"}); *got != *want {
		t.Fatalf("placeholder = %+v, want %+v", got, want)
	}

	store := cache.NewStore(cache.DeletionHandlingMetaNamespaceKeyFunc)
	ours := &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: "va-ours", ResourceVersion: "8"},
		Spec: storagev1.VolumeAttachmentSpec{Attacher: memDriver, NodeName: "node-a"}}
	for _, obj := range []any{got, transformed[*storagev1.VolumeAttachment](t, transform, ours)} {
		if err := store.Add(obj); err != nil {
			t.Fatal(err)
		}
	}
	if va, err := LookupVA(store, "va-other"); va != nil || err != nil {
		t.Fatalf("LookupVA(other attacher's) = %v, %v; want nil, nil", va, err)
	}
	if va, err := LookupVA(store, "va-missing"); va != nil || err != nil {
		t.Fatalf("LookupVA(missing) = %v, %v; want nil, nil", va, err)
	}
	if va, err := LookupVA(store, "va-ours"); err != nil || va == nil || va.ResourceVersion != "8" {
		t.Fatalf("LookupVA(ours) = %+v, %v", va, err)
	}
}
