package decide

import (
	"reflect"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	csitrans "k8s.io/csi-translation-lib"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/kube/kubenames"
)

const testDriver = "csi.test/driver"

var drv = DriverInfo{Name: testDriver, SupportsReadOnly: true, DefaultFSType: "ext4"}

func testVA(mods ...func(*storagev1.VolumeAttachment)) *storagev1.VolumeAttachment {
	pv := "pv-1"
	va := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: "va-1", ResourceVersion: "1"},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: testDriver, NodeName: "node-1",
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv},
		},
	}
	for _, m := range mods {
		m(va)
	}
	return va
}

func testPV(mods ...func(*v1.PersistentVolume)) *v1.PersistentVolume {
	pv := &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pv-1", ResourceVersion: "7"},
		Spec: v1.PersistentVolumeSpec{
			AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{
				Driver: testDriver, VolumeHandle: "vol-1", VolumeAttributes: map[string]string{"k": "v"},
			}},
		},
	}
	for _, m := range mods {
		m(pv)
	}
	return pv
}

func testCSINode(drivers ...string) *storagev1.CSINode {
	n := &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}}
	for _, d := range drivers {
		n.Spec.Drivers = append(n.Spec.Drivers, storagev1.CSINodeDriver{Name: d, NodeID: "node-1-id"})
	}
	return n
}

func recorded(va *storagev1.VolumeAttachment) {
	va.Finalizers = []string{kubenames.AttacherFinalizer(testDriver)}
	va.Annotations = map[string]string{kubenames.VANodeIDAnnotation: "node-1-id", AnnVolumeHandle: "vol-1"}
}

func withFinalizerPV(pv *v1.PersistentVolume) {
	pv.Finalizers = []string{kubenames.PVFinalizer(testDriver)}
}

func TestAttach(t *testing.T) {
	now := metav1.Now()
	tr := testTranslator{csitrans.New()}
	inlineSpec := testPV().Spec
	cases := []struct {
		name        string
		obs         Observed
		drv         DriverInfo
		wantBlocked Reason
		wantMsg     string // substring of the Blocked message
		check       func(t *testing.T, p AttachPlan)
	}{
		{
			name: "new VA with a CSI PV: PV finalizer, then VA finalizer + node ID + handle, then publish",
			obs:  Observed{VA: testVA(), PV: testPV(), CSINode: testCSINode(testDriver)},
			check: func(t *testing.T, p AttachPlan) {
				if p.AddPVFinalizer != "pv-1" {
					t.Errorf("AddPVFinalizer = %q, want pv-1", p.AddPVFinalizer)
				}
				want := &MetadataChange{AddFinalizer: "external-attacher/csi-test-driver", SetAnnotations: map[string]string{
					kubenames.VANodeIDAnnotation: "node-1-id", AnnVolumeHandle: "vol-1"}}
				if !reflect.DeepEqual(p.Metadata, want) {
					t.Errorf("Metadata = %+v, want %+v", p.Metadata, want)
				}
				if p.NodeID != "node-1-id" || p.Volume.Handle != "vol-1" || p.Volume.FSType != "ext4" {
					t.Errorf("plan = %+v", p)
				}
				if p.Volume.VolumeContext["k"] != "v" {
					t.Errorf("volume context = %v, want k=v", p.Volume.VolumeContext)
				}
			},
		},
		{
			name: "finalizers and annotations already recorded, not attached: publish only",
			obs:  Observed{VA: testVA(recorded), PV: testPV(withFinalizerPV), CSINode: testCSINode(testDriver)},
			check: func(t *testing.T, p AttachPlan) {
				if p.AddPVFinalizer != "" || p.Metadata != nil || p.Done {
					t.Errorf("plan = %+v, want publish only", p)
				}
			},
		},
		{
			name: "attached and recorded: done, no writes",
			obs: Observed{VA: testVA(recorded, func(va *storagev1.VolumeAttachment) { va.Status.Attached = true }),
				PV: testPV(withFinalizerPV), CSINode: testCSINode(testDriver)},
			check: func(t *testing.T, p AttachPlan) {
				if !p.Done {
					t.Errorf("plan = %+v, want Done", p)
				}
			},
		},
		{
			name: "secret reference is recorded for detach",
			obs: Observed{VA: testVA(recorded), CSINode: testCSINode(testDriver), PV: testPV(withFinalizerPV, func(pv *v1.PersistentVolume) {
				pv.Spec.CSI.ControllerPublishSecretRef = &v1.SecretReference{Namespace: "ns", Name: "s"}
			})},
			check: func(t *testing.T, p AttachPlan) {
				if p.Metadata == nil || p.Metadata.SetAnnotations[AnnSecretRef] != "ns/s" || p.Metadata.AddFinalizer != "" {
					t.Errorf("Metadata = %+v, want only the secret annotation", p.Metadata)
				}
			},
		},
		{
			name:        "both sources set → InvalidSource",
			obs:         Observed{VA: testVA(func(va *storagev1.VolumeAttachment) { va.Spec.Source.InlineVolumeSpec = &inlineSpec }), PV: testPV(), CSINode: testCSINode(testDriver)},
			wantBlocked: ReasonInvalidSource, wantMsg: "both",
		},
		{
			name:        "no source → InvalidSource",
			obs:         Observed{VA: testVA(func(va *storagev1.VolumeAttachment) { va.Spec.Source.PersistentVolumeName = nil }), CSINode: testCSINode(testDriver)},
			wantBlocked: ReasonInvalidSource, wantMsg: "neither",
		},
		{
			name:        "PV missing → WaitingForPV naming the PV",
			obs:         Observed{VA: testVA(), CSINode: testCSINode(testDriver)},
			wantBlocked: ReasonWaitingForPV, wantMsg: `PersistentVolume "pv-1" not found`,
		},
		{
			name:        "PV being deleted → PVDeleting",
			obs:         Observed{VA: testVA(), PV: testPV(func(pv *v1.PersistentVolume) { pv.DeletionTimestamp = &now }), CSINode: testCSINode(testDriver)},
			wantBlocked: ReasonPVDeleting, wantMsg: "being deleted",
		},
		{
			name: "PV that is neither CSI nor migratable → UnsupportedVolume",
			obs: Observed{VA: testVA(), CSINode: testCSINode(testDriver), PV: testPV(func(pv *v1.PersistentVolume) {
				pv.Spec.CSI = nil
				pv.Spec.NFS = &v1.NFSVolumeSource{Server: "s", Path: "/"}
			})},
			wantBlocked: ReasonUnsupportedVolume, wantMsg: "not a CSI volume",
		},
		{
			name: "PV of another driver → UnsupportedVolume naming both drivers",
			obs: Observed{VA: testVA(), CSINode: testCSINode(testDriver), PV: testPV(func(pv *v1.PersistentVolume) {
				pv.Spec.CSI.Driver = "other.csi"
			})},
			wantBlocked: ReasonUnsupportedVolume, wantMsg: `"other.csi"`,
		},
		{
			name:        "CSINode missing → WaitingForCSINode",
			obs:         Observed{VA: testVA(), PV: testPV()},
			wantBlocked: ReasonWaitingForCSINode, wantMsg: `CSINode "node-1" not found`,
		},
		{
			name:        "CSINode without our driver → WaitingForCSINode",
			obs:         Observed{VA: testVA(), PV: testPV(), CSINode: testCSINode("other.csi")},
			wantBlocked: ReasonWaitingForCSINode, wantMsg: "does not contain driver",
		},
		{
			name:        "empty node name → WaitingForCSINode with a clear message",
			obs:         Observed{VA: testVA(func(va *storagev1.VolumeAttachment) { va.Spec.NodeName = "" }), PV: testPV()},
			wantBlocked: ReasonWaitingForCSINode, wantMsg: "spec.nodeName is empty",
		},
		{
			name: "inline CSI spec: no PV finalizer, publish",
			obs: Observed{VA: testVA(func(va *storagev1.VolumeAttachment) {
				va.Spec.Source.PersistentVolumeName = nil
				va.Spec.Source.InlineVolumeSpec = &inlineSpec
			}), CSINode: testCSINode(testDriver)},
			check: func(t *testing.T, p AttachPlan) {
				if p.AddPVFinalizer != "" || p.Volume.Handle != "vol-1" {
					t.Errorf("plan = %+v", p)
				}
			},
		},
		{
			name: "in-tree GCE PD PV is translated for the migrated driver",
			obs: Observed{VA: testVA(func(va *storagev1.VolumeAttachment) { va.Spec.Attacher = "pd.csi.storage.gke.io" }),
				CSINode: func() *storagev1.CSINode { n := testCSINode("pd.csi.storage.gke.io"); return n }(),
				PV: testPV(func(pv *v1.PersistentVolume) {
					pv.Spec.CSI = nil
					pv.Spec.GCEPersistentDisk = &v1.GCEPersistentDiskVolumeSource{PDName: "disk-1"}
					pv.Labels = map[string]string{v1.LabelTopologyZone: "us-central1-a"}
				})},
			drv: DriverInfo{Name: "pd.csi.storage.gke.io"},
			check: func(t *testing.T, p AttachPlan) {
				if !p.Volume.Migrated || !strings.HasSuffix(p.Volume.Handle, "/disks/disk-1") {
					t.Errorf("volume = %+v, want migrated GCE PD handle", p.Volume)
				}
			},
		},
		{
			name: "readonly PV: readonly only when the driver supports PUBLISH_READONLY",
			obs: Observed{VA: testVA(recorded), CSINode: testCSINode(testDriver), PV: testPV(withFinalizerPV, func(pv *v1.PersistentVolume) {
				pv.Spec.CSI.ReadOnly = true
			})},
			drv: DriverInfo{Name: testDriver, SupportsReadOnly: false},
			check: func(t *testing.T, p AttachPlan) {
				if p.Volume.ReadOnly {
					t.Errorf("readonly sent to a driver without PUBLISH_READONLY")
				}
			},
		},
		{
			name: "readonly PV with PUBLISH_READONLY is published readonly",
			obs: Observed{VA: testVA(recorded), CSINode: testCSINode(testDriver), PV: testPV(withFinalizerPV, func(pv *v1.PersistentVolume) {
				pv.Spec.CSI.ReadOnly = true
			})},
			check: func(t *testing.T, p AttachPlan) {
				if !p.Volume.ReadOnly {
					t.Errorf("readonly PV not published readonly")
				}
			},
		},
		{
			name: "block PV gets no fsType default",
			obs: Observed{VA: testVA(recorded), CSINode: testCSINode(testDriver), PV: testPV(withFinalizerPV, func(pv *v1.PersistentVolume) {
				m := v1.PersistentVolumeBlock
				pv.Spec.VolumeMode = &m
			})},
			check: func(t *testing.T, p AttachPlan) {
				if !p.Volume.Block || p.Volume.FSType != "" {
					t.Errorf("volume = %+v, want block without fsType", p.Volume)
				}
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := tc.drv
			if d.Name == "" {
				d = drv
			}
			p := Attach(tc.obs, d, tr)
			if tc.wantBlocked != "" {
				if p.Blocked == nil || p.Blocked.Reason != tc.wantBlocked {
					t.Fatalf("plan = %+v, want Blocked %s", p, tc.wantBlocked)
				}
				if !strings.Contains(p.Blocked.Message, tc.wantMsg) {
					t.Fatalf("message %q does not contain %q", p.Blocked.Message, tc.wantMsg)
				}
				return
			}
			if p.Blocked != nil {
				t.Fatalf("unexpected Blocked: %+v", p.Blocked)
			}
			tc.check(t, p)
		})
	}
}

func TestDetach(t *testing.T) {
	now := metav1.Now()
	deleting := func(va *storagev1.VolumeAttachment) { va.DeletionTimestamp = &now }
	tr := testTranslator{csitrans.New()}
	cases := []struct {
		name        string
		obs         Observed
		wantDone    bool
		wantBlocked Reason
		wantHandle  string
		wantNodeID  string
		wantSecret  *v1.SecretReference
	}{
		{
			name:     "no finalizer of ours: nothing to do",
			obs:      Observed{VA: testVA(deleting), PV: testPV(), CSINode: testCSINode(testDriver)},
			wantDone: true,
		},
		{
			name:       "PV and CSINode present: unpublish with their data",
			obs:        Observed{VA: testVA(deleting, recorded), PV: testPV(), CSINode: testCSINode(testDriver)},
			wantHandle: "vol-1", wantNodeID: "node-1-id",
		},
		{
			name: "PV deleted first: handle and secret from annotations",
			obs: Observed{VA: testVA(deleting, recorded, func(va *storagev1.VolumeAttachment) {
				va.Annotations[AnnSecretRef] = "ns/s"
			}), CSINode: testCSINode(testDriver)},
			wantHandle: "vol-1", wantNodeID: "node-1-id", wantSecret: &v1.SecretReference{Namespace: "ns", Name: "s"},
		},
		{
			name:       "CSINode gone: node ID from the annotation",
			obs:        Observed{VA: testVA(deleting, recorded), PV: testPV()},
			wantHandle: "vol-1", wantNodeID: "node-1-id",
		},
		{
			name: "PV gone and no handle annotation (attached by another attacher): NoVolumeHandle",
			obs: Observed{VA: testVA(deleting, func(va *storagev1.VolumeAttachment) {
				va.Finalizers = []string{kubenames.AttacherFinalizer(testDriver)}
			}), CSINode: testCSINode(testDriver)},
			wantBlocked: ReasonNoVolumeHandle,
		},
		{
			name: "CSINode gone and no node-id annotation: WaitingForCSINode",
			obs: Observed{VA: testVA(deleting, func(va *storagev1.VolumeAttachment) {
				va.Finalizers = []string{kubenames.AttacherFinalizer(testDriver)}
			}), PV: testPV()},
			wantBlocked: ReasonWaitingForCSINode,
		},
		{
			name: "PV being deleted, attached by upstream (no handle annotation): the deleting PV's spec unpublishes it",
			obs: Observed{VA: testVA(deleting, func(va *storagev1.VolumeAttachment) {
				va.Finalizers = []string{kubenames.AttacherFinalizer(testDriver)}
				va.Annotations = map[string]string{kubenames.VANodeIDAnnotation: "node-1-id"}
				va.Status.Attached = true
			}), PV: testPV(withFinalizerPV, func(pv *v1.PersistentVolume) { pv.DeletionTimestamp = &now }), CSINode: testCSINode(testDriver)},
			wantHandle: "vol-1", wantNodeID: "node-1-id",
		},
		{
			name: "our finalizer removed by another client, still marked attached, another finalizer keeps it: unpublish what was recorded",
			obs: Observed{VA: testVA(deleting, recorded, func(va *storagev1.VolumeAttachment) {
				va.Finalizers = []string{"example.com/keep"}
				va.Status.Attached = true
			}), CSINode: testCSINode(testDriver)},
			wantHandle: "vol-1", wantNodeID: "node-1-id",
		},
		{
			name: "our finalizer removed, marked attached, but no finalizer at all (our own last removal seen late): nothing to do",
			obs: Observed{VA: testVA(deleting, recorded, func(va *storagev1.VolumeAttachment) {
				va.Finalizers = nil
				va.Status.Attached = true
			}), PV: testPV(), CSINode: testCSINode(testDriver)},
			wantDone: true,
		},
		{
			name: "our finalizer removed, another keeps it, marked detached: nothing to do",
			obs: Observed{VA: testVA(deleting, recorded, func(va *storagev1.VolumeAttachment) {
				va.Finalizers = []string{"example.com/keep"}
			}), PV: testPV(), CSINode: testCSINode(testDriver)},
			wantDone: true,
		},
		{
			name: "our finalizer removed, still marked attached, but nothing recorded (attached by upstream): nothing to do",
			obs: Observed{VA: testVA(deleting, func(va *storagev1.VolumeAttachment) {
				va.Finalizers = []string{"example.com/keep"}
				va.Annotations = map[string]string{kubenames.VANodeIDAnnotation: "node-1-id"}
				va.Status.Attached = true
			}), PV: testPV(), CSINode: testCSINode(testDriver)},
			wantDone: true,
		},
		{
			name:        "trivial mode, our finalizer from when the driver could unpublish: UnpublishUnsupported, finalizer kept",
			obs:         Observed{VA: testVA(deleting, recorded, func(va *storagev1.VolumeAttachment) { va.Status.Attached = true }), Trivial: true},
			wantBlocked: ReasonUnpublishUnsupported,
		},
		{
			name:     "trivial mode without our finalizer: nothing to do",
			obs:      Observed{VA: testVA(deleting, func(va *storagev1.VolumeAttachment) { va.Status.Attached = true }), Trivial: true},
			wantDone: true,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := Detach(tc.obs, drv, tr)
			switch {
			case tc.wantDone:
				if !p.Done {
					t.Fatalf("plan = %+v, want Done", p)
				}
			case tc.wantBlocked != "":
				if p.Blocked == nil || p.Blocked.Reason != tc.wantBlocked {
					t.Fatalf("plan = %+v, want Blocked %s", p, tc.wantBlocked)
				}
			default:
				if p.Blocked != nil || p.Done {
					t.Fatalf("plan = %+v, want unpublish", p)
				}
				if p.Volume.Handle != tc.wantHandle || p.NodeID != tc.wantNodeID {
					t.Fatalf("unpublish %q from %q, want %q from %q", p.Volume.Handle, p.NodeID, tc.wantHandle, tc.wantNodeID)
				}
				if !reflect.DeepEqual(p.Volume.Secret, tc.wantSecret) {
					t.Fatalf("secret = %+v, want %+v", p.Volume.Secret, tc.wantSecret)
				}
			}
		})
	}
}

func TestDecideRepairs(t *testing.T) {
	now := metav1.Now()
	attached := testVA(recorded, func(va *storagev1.VolumeAttachment) { va.Name = "attached"; va.Status.Attached = true })
	lost := testVA(recorded, func(va *storagev1.VolumeAttachment) {
		va.Name = "lost"
		va.Status.Attached = true
		va.Annotations[AnnVolumeHandle] = "vol-2"
	})
	stuck := testVA(recorded, func(va *storagev1.VolumeAttachment) {
		va.Name = "stuck"
		va.DeletionTimestamp = &now
		va.Annotations[AnnVolumeHandle] = "vol-3"
		va.Status.DetachError = &storagev1.VolumeError{Message: "driver said no"}
	})
	// Being deleted and still published, but its detach has not failed:
	// it is queued or in flight, nothing to repair.
	detaching := testVA(recorded, func(va *storagev1.VolumeAttachment) {
		va.Name = "detaching"
		va.DeletionTimestamp = &now
		va.Annotations[AnnVolumeHandle] = "vol-4"
	})
	pending := testVA(func(va *storagev1.VolumeAttachment) { va.Name = "pending" })
	published := map[string][]string{"vol-1": {"node-1-id"}, "vol-3": {"node-1-id"}, "vol-4": {"node-1-id"}}
	got := Repairs([]*storagev1.VolumeAttachment{attached, lost, stuck, detaching, pending}, published, testDriver)
	want := []Repair{{VA: "lost", UID: lost.UID, Action: "republish"}, {VA: "stuck", UID: stuck.UID, Action: "unpublish"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("repairs = %+v, want %+v", got, want)
	}
}

// testTranslator binds a logger to csi-translation-lib's translator, as
// package attacher does.
type testTranslator struct{ tr csitrans.CSITranslator }

func (t testTranslator) IsPVMigratable(pv *v1.PersistentVolume) bool { return t.tr.IsPVMigratable(pv) }

func (t testTranslator) TranslateInTreePVToCSI(pv *v1.PersistentVolume) (*v1.PersistentVolume, error) {
	return t.tr.TranslateInTreePVToCSI(klog.Background(), pv)
}
