package decide

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/kube/kubenames"
)

func TestOrphanOwner(t *testing.T) {
	now := metav1.Now()
	deleting := func(va *storagev1.VolumeAttachment) { va.DeletionTimestamp = &now }
	otherFinalizerOnly := func(va *storagev1.VolumeAttachment) { va.Finalizers = []string{"example.com/keep"} }
	attached := func(va *storagev1.VolumeAttachment) { va.Status.Attached = true }
	o := Orphan{Handle: "vol-1", NodeID: "node-1-id", PV: "pv-1"}
	cases := []struct {
		name string
		obs  Observed
		want Ownership
	}{
		{"new VA for the same volume and node, no finalizer yet: owner once its finalizer lands",
			Observed{VA: testVA(), PV: testPV(withFinalizerPV), CSINode: testCSINode(testDriver)}, OwnerOnceRecorded},
		{"VA with our finalizer recording the same volume and node: owner",
			Observed{VA: testVA(recorded), PV: testPV(withFinalizerPV), CSINode: testCSINode(testDriver)}, Owner},
		{"VA attached by upstream (finalizer and node ID, no handle annotation) for the same volume: owner",
			Observed{VA: testVA(attached, func(va *storagev1.VolumeAttachment) {
				va.Finalizers = []string{kubenames.AttacherFinalizer(testDriver)}
				va.Annotations = map[string]string{kubenames.VANodeIDAnnotation: "node-1-id"}
			}), PV: testPV(withFinalizerPV), CSINode: testCSINode(testDriver)}, Owner},
		{"VA recording the same volume and node whose finalizer was removed (not deleting): owner once it is back",
			Observed{VA: testVA(recorded, otherFinalizerOnly), PV: testPV(withFinalizerPV), CSINode: testCSINode(testDriver)}, OwnerOnceRecorded},
		{"new VA for another node ID: not owner",
			Observed{VA: testVA(), PV: testPV(), CSINode: &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: "node-1"},
				Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{Name: testDriver, NodeID: "node-2-id"}}}}}, NotOwner},
		{"new VA for another volume: not owner",
			Observed{VA: testVA(), PV: testPV(func(pv *v1.PersistentVolume) { pv.Spec.CSI.VolumeHandle = "vol-2" }), CSINode: testCSINode(testDriver)}, NotOwner},
		{"new VA whose attach is blocked (CSINode missing): not owner",
			Observed{VA: testVA(), PV: testPV()}, NotOwner},
		{"new VA whose PV is being deleted (its attach will not publish): not owner",
			Observed{VA: testVA(), PV: testPV(func(pv *v1.PersistentVolume) { pv.DeletionTimestamp = &now }), CSINode: testCSINode(testDriver)}, NotOwner},
		{"deleting VA with our finalizer recording the same volume and node: owner (its detach undoes it)",
			Observed{VA: testVA(recorded, deleting), PV: testPV(), CSINode: testCSINode(testDriver)}, Owner},
		{"deleting VA without our finalizer (no detach of ours will come): not owner",
			Observed{VA: testVA(recorded, deleting, otherFinalizerOnly), PV: testPV(), CSINode: testCSINode(testDriver)}, NotOwner},
		{"deleting VA with our finalizer recording another node ID: not owner",
			Observed{VA: testVA(recorded, deleting, func(va *storagev1.VolumeAttachment) { va.Annotations[kubenames.VANodeIDAnnotation] = "node-2-id" }),
				PV: testPV(), CSINode: testCSINode(testDriver)}, NotOwner},
		{"VA of another attacher: not owner",
			Observed{VA: testVA(recorded, func(va *storagev1.VolumeAttachment) { va.Spec.Attacher = "other.csi.test" }), PV: testPV(), CSINode: testCSINode(testDriver)}, NotOwner},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := OrphanOwner(tc.obs, drv, nil, o); got != tc.want {
				t.Fatalf("OrphanOwner = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestForgetUnlistedAndStillUncertain(t *testing.T) {
	certain := Orphan{Handle: "vol-1", NodeID: "node-1-id"}
	uncertain := Orphan{Handle: "vol-1", NodeID: "node-1-id", Uncertain: true}
	cases := []struct {
		name   string
		o      Orphan
		listed bool
		want   bool
	}{
		{"published orphan no longer listed: forgotten (nothing left to undo)", certain, false, true},
		{"published orphan still listed: kept", certain, true, false},
		{"orphan of a publish of unknown outcome not listed: kept (the publish may still land)", uncertain, false, false},
		{"orphan of a publish of unknown outcome listed: kept", uncertain, true, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := ForgetUnlisted(tc.o, tc.listed); got != tc.want {
				t.Fatalf("ForgetUnlisted = %v, want %v", got, tc.want)
			}
		})
	}
	if !StillUncertain(uncertain, false) {
		t.Errorf("unknown-outcome orphan whose unpublish was answered Aborted/Unavailable: want still uncertain")
	}
	if StillUncertain(uncertain, true) {
		t.Errorf("unknown-outcome orphan whose unpublish was answered with a final code: want settled")
	}
	if StillUncertain(certain, false) {
		t.Errorf("published orphan: never uncertain")
	}
}

func TestOrphanHoldsPV(t *testing.T) {
	pv := testPV()
	cases := []struct {
		name string
		o    Orphan
		want bool
	}{
		{"orphan published from the PV: holds it", Orphan{Handle: "vol-1", NodeID: "n", PV: "pv-1"}, true},
		{"orphan published from another PV with the same handle: does not", Orphan{Handle: "vol-1", NodeID: "n", PV: "pv-2"}, false},
		{"older record without a PV name, same handle of our driver: holds it", Orphan{Handle: "vol-1", NodeID: "n"}, true},
		{"older record without a PV name, another handle: does not", Orphan{Handle: "vol-2", NodeID: "n"}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := OrphanHoldsPV(tc.o, pv, testDriver); got != tc.want {
				t.Fatalf("OrphanHoldsPV = %v, want %v", got, tc.want)
			}
		})
	}
	foreign := testPV(func(pv *v1.PersistentVolume) { pv.Spec.CSI.Driver = "other.csi.test" })
	if OrphanHoldsPV(Orphan{Handle: "vol-1"}, foreign, testDriver) {
		t.Errorf("older record matched another driver's PV by handle")
	}
}

func TestPublishedForGone(t *testing.T) {
	now := metav1.Now()
	va := func(mods ...func(*storagev1.VolumeAttachment)) *storagev1.VolumeAttachment {
		return testVA(append([]func(*storagev1.VolumeAttachment){recorded, func(va *storagev1.VolumeAttachment) { va.UID = "u1" }}, mods...)...)
	}
	cases := []struct {
		name string
		live *storagev1.VolumeAttachment
		want bool
	}{
		{"gone: orphaned", nil, true},
		{"replaced by a new object of the same name: orphaned", va(func(va *storagev1.VolumeAttachment) { va.UID = "u2" }), true},
		{"there with our finalizer: a detach of ours will come", va(), false},
		{"deleting with our finalizer: our detach undoes it", va(func(va *storagev1.VolumeAttachment) { va.DeletionTimestamp = &now }), false},
		{"deleting, our finalizer removed, another keeps it: orphaned", va(func(va *storagev1.VolumeAttachment) {
			va.DeletionTimestamp = &now
			va.Finalizers = []string{"example.com/keep"}
		}), true},
		{"not deleting, our finalizer removed: its attach adds it again before publishing", va(func(va *storagev1.VolumeAttachment) { va.Finalizers = nil }), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := PublishedForGone(tc.live, "u1", testDriver); got != tc.want {
				t.Fatalf("PublishedForGone = %v, want %v", got, tc.want)
			}
		})
	}
}
