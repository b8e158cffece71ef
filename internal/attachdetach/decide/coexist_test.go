package decide

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The managedFields below are what kube-controller-manager v1.36.3's
// attach/detach controller and latch's components wrote in a test cluster
// (test/interop), trimmed to one entry each.
const (
	kcmVASpec       = `{"f:spec":{"f:attacher":{},"f:nodeName":{},"f:source":{"f:persistentVolumeName":{}}}}`
	attacherVAMeta  = `{"f:metadata":{"f:annotations":{".":{},"f:csi.alpha.kubernetes.io/node-id":{}},"f:finalizers":{".":{},"v:\"external-attacher/pd-csi-storage-gke-io\"":{}}}}`
	attacherVAStat  = `{"f:status":{"f:attached":{},"f:attachmentMetadata":{".":{},"f:devicePath":{}}}}`
	kcmNodeAttached = `{"f:status":{"f:volumesAttached":{}}}`
	kubeletInUse    = `{"f:status":{"f:volumesInUse":{}}}`
	// kcm's node lifecycle controller shares kcm's entry for the status
	// subresource: a condition write bumps the entry's time.
	kcmNodeAttachedAndConditions = `{"f:status":{"f:conditions":{},"f:volumesAttached":{}}}`
)

var (
	cxT0     = time.Date(2026, 11, 26, 3, 0, 0, 0, time.UTC)
	cxBefore = cxT0.Add(-time.Minute)
	cxAfter  = cxT0.Add(time.Minute)
	cxOurs   = "latch-attachdetach-controller"
)

func mfEntry(manager, subresource, fields string, at time.Time) metav1.ManagedFieldsEntry {
	return metav1.ManagedFieldsEntry{
		Manager: manager, Operation: metav1.ManagedFieldsOperationUpdate, Subresource: subresource,
		Time: &metav1.Time{Time: at}, FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(fields),
	}
}

func cxVAFacts(created time.Time, entries ...metav1.ManagedFieldsEntry) CoexistFacts {
	return CoexistFacts{Kind: CoexistVolumeAttachment, Name: "csi-1", Watermark: cxT0, Ours: []string{cxOurs},
		Created: created, NodeManaged: true, ManagedFields: entries}
}

func cxNodeFacts(changed bool, entries ...metav1.ManagedFieldsEntry) CoexistFacts {
	return CoexistFacts{Kind: CoexistNode, Name: "node-a", Watermark: cxT0, Ours: []string{cxOurs},
		VolumesAttachedChanged: changed, ManagedFields: entries}
}

func TestDecideCoexistence(t *testing.T) {
	tests := []struct {
		name  string
		facts CoexistFacts
		want  *CoexistEvidence
	}{
		{
			name:  "VA created by kcm after we started: evidence",
			facts: cxVAFacts(cxAfter, mfEntry("kube-controller-manager", "", kcmVASpec, cxAfter), mfEntry("latch-csi-attacher", "", attacherVAMeta, cxAfter), mfEntry("latch-csi-attacher", "status", attacherVAStat, cxAfter)),
			want:  &CoexistEvidence{Manager: "kube-controller-manager", Kind: CoexistVolumeAttachment, Name: "csi-1", Field: "spec", At: cxAfter},
		},
		{
			name:  "VA created by a renamed kcm binary: named as the API server named it",
			facts: cxVAFacts(cxAfter, mfEntry("my-kcm", "", kcmVASpec, cxAfter)),
			want:  &CoexistEvidence{Manager: "my-kcm", Kind: CoexistVolumeAttachment, Name: "csi-1", Field: "spec", At: cxAfter},
		},
		{
			name:  "VA created by us: none",
			facts: cxVAFacts(cxAfter, mfEntry(cxOurs, "", kcmVASpec, cxAfter), mfEntry("kube-controller-manager", "", attacherVAMeta, cxAfter)),
		},
		{
			name:  "VA kcm created before we started (the swap): none",
			facts: cxVAFacts(cxBefore, mfEntry("kube-controller-manager", "", kcmVASpec, cxBefore), mfEntry("latch-csi-attacher", "status", attacherVAStat, cxAfter)),
		},
		{
			name:  "VA kcm created in the same second as the watermark: none (not provably later)",
			facts: cxVAFacts(cxT0, mfEntry("kube-controller-manager", "", kcmVASpec, cxT0)),
		},
		{
			name: "VA of a node whose kubelet attaches its own volumes: none",
			facts: func() CoexistFacts {
				f := cxVAFacts(cxAfter, mfEntry("kubelet", "", kcmVASpec, cxAfter))
				f.NodeManaged = false
				return f
			}(),
		},
		{
			name: "VA seen in the initial list: history, none",
			facts: func() CoexistFacts {
				f := cxVAFacts(cxAfter, mfEntry("kube-controller-manager", "", kcmVASpec, cxAfter))
				f.Initial = true
				return f
			}(),
		},
		{
			name:  "VA whose spec nobody owns (managedFields off): none",
			facts: cxVAFacts(cxAfter, mfEntry("latch-csi-attacher", "status", attacherVAStat, cxAfter)),
		},
		{
			name:  "node volumesAttached changed by kcm after we started: evidence",
			facts: cxNodeFacts(true, mfEntry("latch-kubelet-standin", "status", kubeletInUse, cxAfter), mfEntry("kube-controller-manager", "status", kcmNodeAttached, cxAfter)),
			want:  &CoexistEvidence{Manager: "kube-controller-manager", Kind: CoexistNode, Name: "node-a", Field: "status.volumesAttached", At: cxAfter},
		},
		{
			name:  "node volumesAttached changed by us: none",
			facts: cxNodeFacts(true, mfEntry(cxOurs, "status", kcmNodeAttached, cxAfter), mfEntry("kube-controller-manager", "status", kubeletInUse, cxAfter)),
		},
		{
			name:  "node list kcm wrote before the swap, node changed otherwise (kcm's node lifecycle bumps its entry): none",
			facts: cxNodeFacts(false, mfEntry("kube-controller-manager", "status", kcmNodeAttachedAndConditions, cxAfter)),
		},
		{
			name:  "node list changed, still owned by kcm's write from before we started: none",
			facts: cxNodeFacts(true, mfEntry("kube-controller-manager", "status", kcmNodeAttached, cxBefore)),
		},
		{
			name:  "node volumesAttached owned on the main resource (not status): none",
			facts: cxNodeFacts(true, mfEntry("kube-controller-manager", "", kcmNodeAttached, cxAfter)),
		},
		{
			name:  "node list emptied (nobody owns an absent list): none",
			facts: cxNodeFacts(true, mfEntry("latch-kubelet-standin", "status", kubeletInUse, cxAfter)),
		},
		{
			name:  "malformed FieldsV1: none",
			facts: cxNodeFacts(true, mfEntry("kube-controller-manager", "status", `{"f:status":{"f:volumesAttached"`, cxAfter)),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := DecideCoexistence(tt.facts)
			switch {
			case tt.want == nil && ok:
				t.Fatalf("evidence %+v, want none", got)
			case tt.want != nil && !ok:
				t.Fatalf("no evidence, want %+v", *tt.want)
			case tt.want != nil && got != *tt.want:
				t.Fatalf("evidence %+v, want %+v", got, *tt.want)
			}
		})
	}
}

func TestCoexistWatermark(t *testing.T) {
	w := CoexistWatermark(time.Time{}, cxBefore, []metav1.ManagedFieldsEntry{mfEntry("a", "", "{}", cxT0), {Manager: "no time"}})
	if !w.Equal(cxT0) {
		t.Fatalf("watermark %v, want the latest entry time %v", w, cxT0)
	}
	if w = CoexistWatermark(w, cxAfter, nil); !w.Equal(cxAfter) {
		t.Fatalf("watermark %v, want the later creationTimestamp %v", w, cxAfter)
	}
	if w = CoexistWatermark(w, cxBefore, []metav1.ManagedFieldsEntry{mfEntry("a", "", "{}", cxBefore)}); !w.Equal(cxAfter) {
		t.Fatalf("watermark went down to %v", w)
	}
}
