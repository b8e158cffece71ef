package decide

import (
	"testing"

	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// Scenarios around what latch recorded versus what it sees now: the node
// ID a volume was published with (a node replaced under the same name
// registers a new one) and a status.attached=true that latch never wrote.

func csiNodeWithID(id string) *storagev1.CSINode {
	n := testCSINode(testDriver)
	n.Spec.Drivers[0].NodeID = id
	return n
}

func markAttached(va *storagev1.VolumeAttachment) { va.Status.Attached = true }

func TestDecideDetachRecordedNodeID(t *testing.T) {
	now := metav1.Now()
	deleting := func(va *storagev1.VolumeAttachment) { va.DeletionTimestamp = &now }
	cases := []struct {
		name       string
		obs        Observed
		wantNodeID string
	}{
		{
			name:       "node replaced under the same name (CSINode now says new-id): unpublish the ID we published with",
			obs:        Observed{VA: testVA(deleting, recorded, markAttached), PV: testPV(), CSINode: csiNodeWithID("new-id")},
			wantNodeID: "node-1-id",
		},
		{
			name: "no node-id annotation (attached by a build that did not record it): the live CSINode's ID",
			obs: Observed{VA: testVA(deleting, func(va *storagev1.VolumeAttachment) {
				va.Finalizers = []string{kubenames.AttacherFinalizer(testDriver)}
			}), PV: testPV(), CSINode: csiNodeWithID("new-id")},
			wantNodeID: "new-id",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := Detach(tc.obs, drv, nil)
			if p.Blocked != nil || p.Done {
				t.Fatalf("plan = %+v, want unpublish", p)
			}
			if p.NodeID != tc.wantNodeID {
				t.Fatalf("unpublish from node ID %q, want %q", p.NodeID, tc.wantNodeID)
			}
		})
	}
}

func TestDecideAttachRecordedAndForeign(t *testing.T) {
	foreignAttached := func(va *storagev1.VolumeAttachment) {
		va.Status.Attached = true
		va.Status.AttachError = &storagev1.VolumeError{Message: "stale error from someone else"}
	}
	cases := []struct {
		name  string
		obs   Observed
		check func(t *testing.T, p AttachPlan)
	}{
		{
			name: "attached=true written by another client (no finalizer, no node-id annotation): foreign claim, publish and record",
			obs:  Observed{VA: testVA(foreignAttached), PV: testPV(withFinalizerPV), CSINode: testCSINode(testDriver)},
			check: func(t *testing.T, p AttachPlan) {
				if p.Done || !p.Publish || p.NodeID != "node-1-id" {
					t.Fatalf("plan = %+v, want a publish to node-1-id", p)
				}
				if p.Metadata == nil || p.Metadata.AddFinalizer == "" || p.Metadata.SetAnnotations[kubenames.VANodeIDAnnotation] != "node-1-id" {
					t.Fatalf("Metadata = %+v, want finalizer and node ID before the publish", p.Metadata)
				}
			},
		},
		{
			name: "attached=true with our finalizer but no node-id annotation: still foreign, publish",
			obs: Observed{VA: testVA(foreignAttached, func(va *storagev1.VolumeAttachment) {
				va.Finalizers = []string{kubenames.AttacherFinalizer(testDriver)}
			}), PV: testPV(withFinalizerPV), CSINode: testCSINode(testDriver)},
			check: wantPublish,
		},
		{
			name: "attached=true with node-id annotation but no finalizer: still foreign, publish",
			obs: Observed{VA: testVA(foreignAttached, func(va *storagev1.VolumeAttachment) {
				va.Annotations = map[string]string{kubenames.VANodeIDAnnotation: "node-1-id"}
			}), PV: testPV(withFinalizerPV), CSINode: testCSINode(testDriver)},
			check: wantPublish,
		},
		{
			name: "attached by upstream's external-attacher before the swap (finalizer + node-id, no handle annotation): believed, handle recorded, no publish",
			obs: Observed{VA: testVA(markAttached, func(va *storagev1.VolumeAttachment) {
				va.Finalizers = []string{kubenames.AttacherFinalizer(testDriver)}
				va.Annotations = map[string]string{kubenames.VANodeIDAnnotation: "node-1-id"}
			}), PV: testPV(withFinalizerPV), CSINode: testCSINode(testDriver)},
			check: func(t *testing.T, p AttachPlan) {
				if p.Done || p.Publish {
					t.Fatalf("plan = %+v, want the handle annotation only, no publish", p)
				}
				if p.Metadata == nil || p.Metadata.SetAnnotations[AnnVolumeHandle] != "vol-1" || len(p.Metadata.SetAnnotations) != 1 || p.Metadata.AddFinalizer != "" {
					t.Fatalf("Metadata = %+v, want only the handle annotation", p.Metadata)
				}
			},
		},
		{
			name: "attached and recorded, CSINode gone: done (the recorded node ID is what counts)",
			obs:  Observed{VA: testVA(recorded, markAttached), PV: testPV(withFinalizerPV)},
			check: func(t *testing.T, p AttachPlan) {
				if !p.Done {
					t.Fatalf("plan = %+v, want Done", p)
				}
			},
		},
		{
			name: "attached to node-1-id, CSINode now says new-id: done, the annotation is not rewritten (detach unpublishes node-1-id)",
			obs:  Observed{VA: testVA(recorded, markAttached), PV: testPV(withFinalizerPV), CSINode: csiNodeWithID("new-id")},
			check: func(t *testing.T, p AttachPlan) {
				if !p.Done {
					t.Fatalf("plan = %+v, want Done without rewriting the node ID", p)
				}
			},
		},
		{
			name: "not attached, recorded node-1-id, CSINode now says new-id: unpublish node-1-id, then record new-id, then publish to it",
			obs:  Observed{VA: testVA(recorded), PV: testPV(withFinalizerPV), CSINode: csiNodeWithID("new-id")},
			check: func(t *testing.T, p AttachPlan) {
				if !p.Publish || p.NodeID != "new-id" {
					t.Fatalf("plan = %+v, want a publish to new-id", p)
				}
				if p.UnpublishFirst == nil || p.UnpublishFirst.NodeID != "node-1-id" || p.UnpublishFirst.Handle != "vol-1" {
					t.Fatalf("UnpublishFirst = %+v, want vol-1 from node-1-id", p.UnpublishFirst)
				}
				if p.Metadata == nil || p.Metadata.SetAnnotations[kubenames.VANodeIDAnnotation] != "new-id" {
					t.Fatalf("Metadata = %+v, want node ID new-id recorded", p.Metadata)
				}
			},
		},
		{
			name: "not attached, node-id annotation but no finalizer of ours (never published by us): just record the live ID",
			obs: Observed{VA: testVA(func(va *storagev1.VolumeAttachment) {
				va.Annotations = map[string]string{kubenames.VANodeIDAnnotation: "old-id"}
			}), PV: testPV(withFinalizerPV), CSINode: csiNodeWithID("new-id")},
			check: func(t *testing.T, p AttachPlan) {
				if !p.Publish || p.UnpublishFirst != nil || p.NodeID != "new-id" {
					t.Fatalf("plan = %+v, want a plain publish to new-id", p)
				}
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := Attach(tc.obs, drv, nil)
			if p.Blocked != nil {
				t.Fatalf("unexpected Blocked: %+v", p.Blocked)
			}
			tc.check(t, p)
		})
	}
}

// wantPublish is a row's check: the plan publishes.
func wantPublish(t *testing.T, p AttachPlan) {
	t.Helper()
	if p.Done || !p.Publish {
		t.Fatalf("plan = %+v, want a publish", p)
	}
}
