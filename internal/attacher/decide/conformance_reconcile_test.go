package decide

import (
	"reflect"
	"strings"
	"testing"

	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// upstream: TestCSIHandlerReconcileVA. The ListVolumes reconcile's verdict
// for each combination of status.attached, deletion, our finalizer and
// what the driver lists.
func TestConformanceRepairFor(t *testing.T) {
	now := metav1.Now()
	deleting := func(va *storagev1.VolumeAttachment) { va.DeletionTimestamp = &now }
	attached := func(va *storagev1.VolumeAttachment) { va.Status.Attached = true }
	released := func(va *storagev1.VolumeAttachment) { va.Finalizers = []string{"other.example.com/keep"} }
	failed := func(va *storagev1.VolumeAttachment) { va.Status.DetachError = &storagev1.VolumeError{Message: "no"} }
	cases := []struct {
		name      string
		va        *storagev1.VolumeAttachment
		published bool
		want      string
	}{
		{"attached, not listed: re-publish (upstream: va attached actual state not attached)", testVA(recorded, attached), false, "republish"},
		{"attached, listed: nothing (upstream: va attached actual state attached)", testVA(recorded, attached), true, ""},
		{"not attached yet, not listed: nothing, the attach queue has it", testVA(recorded), false, ""},
		{"deleting, ours released, listed: unpublish (upstream: va not attached actual state attached)", testVA(recorded, released, deleting), true, "unpublish"},
		{"deleting, our finalizer removed by hand while attached, listed: unpublish (upstream leaves it)", testVA(recorded, released, attached, deleting), true, "unpublish"},
		{"deleting, ours released, not listed: nothing", testVA(recorded, released, deleting), false, ""},
		{"deleting with our finalizer, detach failed, listed: retry the unpublish now", testVA(recorded, deleting, failed), true, "unpublish"},
		{"deleting with our finalizer, detach queued or in flight: nothing", testVA(recorded, deleting), true, ""},
		{"deleting with our finalizer, not listed: nothing, the detach queue ends it", testVA(recorded, deleting, failed), false, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := RepairFor(tc.va, tc.published, testDriver); got != tc.want {
				t.Fatalf("RepairFor = %q, want %q", got, tc.want)
			}
		})
	}
}

// upstream: TestCSIHandlerReconcileVA "no volume attachments but existing
// lister response results in no action": a publication no VA of ours
// names is not repaired (the orphan record is what undoes publications
// of VAs that are gone). A VA never published by us (no recorded handle
// or node ID) is not judged either.
func TestConformanceRepairsIgnorePublicationsWithoutVA(t *testing.T) {
	unrecorded := testVA(func(va *storagev1.VolumeAttachment) { va.Name = "unrecorded"; va.Status.Attached = true })
	published := map[string][]string{"vol-1": {"node-1-id"}, "vol-9": {"node-1-id"}}
	if got := Repairs(nil, published, testDriver); len(got) != 0 {
		t.Fatalf("repairs without VAs = %+v, want none", got)
	}
	if got := Repairs([]*storagev1.VolumeAttachment{unrecorded}, published, testDriver); len(got) != 0 {
		t.Fatalf("repairs of an unrecorded VA = %+v, want none", got)
	}
}

// A deleting VA without our finalizer is left alone by the detach pass,
// unless the reconcile found it still published: then it is unpublished
// with the recorded handle and node ID.
func TestConformanceDetachStillPublishedWithoutOurFinalizer(t *testing.T) {
	now := metav1.Now()
	va := testVA(recorded, func(va *storagev1.VolumeAttachment) {
		va.DeletionTimestamp = &now
		va.Finalizers = []string{"other.example.com/keep"}
	})
	if p := Detach(Observed{VA: va, PV: testPV(), CSINode: testCSINode(testDriver)}, drv, nil); !p.Done {
		t.Fatalf("plan without StillPublished = %+v, want done", p)
	}
	p := Detach(Observed{VA: va, CSINode: testCSINode(testDriver), StillPublished: true}, drv, nil)
	want := DetachPlan{Volume: Volume{Handle: "vol-1"}, NodeID: "node-1-id"}
	if !reflect.DeepEqual(p, want) {
		t.Fatalf("plan = %+v, want %+v", p, want)
	}
	if p := Detach(Observed{VA: va, StillPublished: true, Trivial: true}, drv, nil); !p.Done {
		t.Fatalf("trivial plan = %+v, want done", p)
	}
}

// upstream: TestCSIHandler "detach VA with neither / both PV and
// InlineCSIVolumeSource reference -> error". Deliberate difference: with
// the handle latch recorded at attach the volume is unpublished anyway;
// without it, the detach is blocked with a message naming the source
// problem, as upstream's detachError does.
func TestConformanceDetachInvalidSource(t *testing.T) {
	now := metav1.Now()
	pv := "pv-1"
	for name, src := range map[string]storagev1.VolumeAttachmentSource{
		"neither": {},
		"both":    {PersistentVolumeName: &pv, InlineVolumeSpec: &testPV().Spec},
	} {
		t.Run(name, func(t *testing.T) {
			va := testVA(recorded, func(va *storagev1.VolumeAttachment) {
				va.DeletionTimestamp = &now
				va.Spec.Source = src
			})
			p := Detach(Observed{VA: va, PV: testPV(), CSINode: testCSINode(testDriver)}, drv, nil)
			if p.Blocked != nil || p.Done || p.Volume.Handle != "vol-1" || p.NodeID != "node-1-id" {
				t.Fatalf("plan with a recorded handle = %+v, want unpublish vol-1 from node-1-id", p)
			}
			delete(va.Annotations, AnnVolumeHandle)
			p = Detach(Observed{VA: va, PV: testPV(), CSINode: testCSINode(testDriver)}, drv, nil)
			if p.Blocked == nil || p.Blocked.Reason != ReasonNoVolumeHandle || !strings.Contains(p.Blocked.Message, "spec.source") {
				t.Fatalf("plan without a recorded handle = %+v, want NoVolumeHandle naming spec.source", p)
			}
		})
	}
}
