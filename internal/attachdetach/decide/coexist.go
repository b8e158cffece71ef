package decide

import (
	"bytes"
	"encoding/json"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The coexistence rule: is another attach/detach controller writing what
// only the attach/detach controller writes? Two fields prove it:
//
//   - a VolumeAttachment's spec, set once by whoever created it (spec is
//     immutable, so the managedFields entry that owns f:spec is the
//     creator's);
//   - a Node's status.volumesAttached (an atomic list: whoever last changed
//     it owns it whole).
//
// kube-controller-manager v1.36 writes both without a field manager of its
// own, so the API server names it after its user agent:
// "kube-controller-manager" (test/interop: TestCoexist_*). latch writes both
// as kube.AttachDetachFieldManager.
//
// Only writes made after this controller started count. Objects carry the
// last writer for as long as nobody else changes the field, so after a swap
// (kube-controller-manager restarted with -attachdetach, then latch started)
// every VolumeAttachment kcm created, and every node list kcm wrote last,
// still names kcm. The rule therefore compares server timestamps with
// server timestamps only: Watermark is the latest managedFields time or
// creationTimestamp seen in the informers' initial lists (what existed
// before we started); a write is evidence only when it is later than that
// and was seen after the initial lists. No clock of ours is involved, so
// clock skew between this Pod and the API server cannot make one.

// CoexistKind is the kind of object the facts are about.
type CoexistKind string

const (
	CoexistVolumeAttachment CoexistKind = "VolumeAttachment"
	CoexistNode             CoexistKind = "Node"
)

// CoexistFacts are what one observation of a VolumeAttachment or a Node
// says about who writes its attach/detach fields.
type CoexistFacts struct {
	Kind CoexistKind
	Name string
	// Initial is true while the informers' initial lists are read: the
	// object is history, and only raises the watermark (see
	// CoexistWatermark).
	Initial bool
	// Watermark is the latest server timestamp of the initial lists.
	Watermark time.Time
	// Ours are the field managers of this controller's own writes.
	Ours []string
	// ManagedFields are the object's metadata.managedFields.
	ManagedFields []metav1.ManagedFieldsEntry

	// Created is a VolumeAttachment's creationTimestamp.
	Created time.Time
	// NodeManaged says whether the VolumeAttachment's node carries
	// volumes.kubernetes.io/controller-managed-attach-detach. A kubelet that
	// attaches its own volumes (the annotation absent) creates its own
	// VolumeAttachments: that is not a second controller.
	NodeManaged bool

	// VolumesAttachedChanged says whether a Node's status.volumesAttached
	// differs from the previous observation of the same node (true for a
	// node seen for the first time with a non-empty list).
	VolumesAttachedChanged bool
}

// CoexistEvidence is one write by another attach/detach controller.
type CoexistEvidence struct {
	// Manager is the other writer's field manager.
	Manager string
	Kind    CoexistKind
	Name    string
	// Field is what it wrote: "spec" (it created the VolumeAttachment) or
	// "status.volumesAttached".
	Field string
	// At is the server's time of the write.
	At time.Time
}

// DecideCoexistence returns the evidence the facts hold, if any.
func DecideCoexistence(f CoexistFacts) (CoexistEvidence, bool) {
	if f.Initial {
		return CoexistEvidence{}, false
	}
	switch f.Kind {
	case CoexistVolumeAttachment:
		if !f.NodeManaged || !f.Created.After(f.Watermark) {
			return CoexistEvidence{}, false
		}
		o, ok := fieldOwner(f.ManagedFields, "", "f:spec")
		if !ok || slices.Contains(f.Ours, o.Manager) {
			return CoexistEvidence{}, false
		}
		return CoexistEvidence{Manager: o.Manager, Kind: f.Kind, Name: f.Name, Field: "spec", At: f.Created}, true
	case CoexistNode:
		if !f.VolumesAttachedChanged {
			return CoexistEvidence{}, false
		}
		o, ok := fieldOwner(f.ManagedFields, "status", "f:status", "f:volumesAttached")
		if !ok || slices.Contains(f.Ours, o.Manager) || o.Time == nil || !o.Time.After(f.Watermark) {
			return CoexistEvidence{}, false
		}
		return CoexistEvidence{Manager: o.Manager, Kind: f.Kind, Name: f.Name, Field: "status.volumesAttached", At: o.Time.Time}, true
	}
	return CoexistEvidence{}, false
}

// CoexistWatermark returns w raised to the latest server timestamp in the
// object's creationTimestamp and managedFields.
func CoexistWatermark(w time.Time, created time.Time, fields []metav1.ManagedFieldsEntry) time.Time {
	if created.After(w) {
		w = created
	}
	for _, e := range fields {
		if e.Time != nil && e.Time.After(w) {
			w = e.Time.Time
		}
	}
	return w
}

// fieldOwner returns the managedFields entry of subresource that owns the
// field at path (FieldsV1 keys, e.g. "f:spec"), or any field below it.
func fieldOwner(entries []metav1.ManagedFieldsEntry, subresource string, path ...string) (metav1.ManagedFieldsEntry, bool) {
	last := []byte(`"` + path[len(path)-1] + `"`)
	for _, e := range entries {
		if e.Subresource != subresource || e.FieldsV1 == nil || !bytes.Contains(e.FieldsV1.GetRawBytes(), last) {
			continue
		}
		if hasField(e.FieldsV1.GetRawBytes(), path) {
			return e, true
		}
	}
	return metav1.ManagedFieldsEntry{}, false
}

// hasField says whether the FieldsV1 document raw has the key path.
func hasField(raw []byte, path []string) bool {
	for _, key := range path {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(raw, &m); err != nil {
			return false
		}
		next, ok := m[key]
		if !ok {
			return false
		}
		raw = next
	}
	return true
}
