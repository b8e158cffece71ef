package diagnose

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"

	storagev1 "k8s.io/api/storage/v1"

	"github.com/latchcsi/latch/internal/kube"
)

// kcmFieldManager is the field manager of kube-controller-manager's
// attach/detach controller: it creates VolumeAttachments without a field
// manager of its own (k8s.io/kubernetes pkg/volume/csi, v1.36), so the API
// server names it after its user agent, "kube-controller-manager".
const kcmFieldManager = "kube-controller-manager"

// StatusFindings are the findings of `latchctl status` about all
// VolumeAttachments together: today, two attach/detach controllers at
// once (kube-controller-manager's and latch's).
//
// A VolumeAttachment's spec is immutable, so the managedFields entry that
// owns f:spec names the controller that created it. After a swap one way
// or the other, every VolumeAttachment of the old controller is older than
// every one of the new: that is history, reported as info. When the
// creation times interleave (each controller created one after the other
// did), both run at once: a problem.
func StatusFindings(vas []*storagev1.VolumeAttachment) []Finding {
	var kcm, latch []*storagev1.VolumeAttachment
	for _, va := range vas {
		switch creator(va) {
		case kcmFieldManager:
			kcm = append(kcm, va)
		case kube.AttachDetachFieldManager:
			latch = append(latch, va)
		}
	}
	if len(kcm) == 0 || len(latch) == 0 {
		return nil
	}
	byAge := func(a, b *storagev1.VolumeAttachment) int {
		return a.CreationTimestamp.Compare(b.CreationTimestamp.Time)
	}
	slices.SortStableFunc(kcm, byAge)
	slices.SortStableFunc(latch, byAge)
	kOld, kNew := kcm[0], kcm[len(kcm)-1]
	lOld, lNew := latch[0], latch[len(latch)-1]
	created := func(va *storagev1.VolumeAttachment) time.Time { return va.CreationTimestamp.Time }
	kcmDesc := fmt.Sprintf("field manager %q (kube-controller-manager's attach/detach controller) created %d, from %s to %s",
		kcmFieldManager, len(kcm), stamp(created(kOld)), stamp(created(kNew)))
	latchDesc := fmt.Sprintf("field manager %q (latch's attachdetach-controller) created %d, from %s to %s",
		kube.AttachDetachFieldManager, len(latch), stamp(created(lOld)), stamp(created(lNew)))

	if !created(kNew).Before(created(lOld)) && !created(lNew).Before(created(kOld)) {
		// Interleaved: the example is a kcm VolumeAttachment created
		// while latch's controller was creating them too.
		example := kNew
		obj := "VolumeAttachment " + example.Name
		return []Finding{{Check: "controllers.coexist", Object: obj, Status: StatusProblem,
			Message: fmt.Sprintf("two attach/detach controllers create VolumeAttachments at once: %s (the latest %s), while %s; they attach and detach the same volumes and undo each other's decisions",
				kcmDesc, example.Name, latchDesc),
			Hint: fmt.Sprintf("keep one: run kube-controller-manager with --controllers=*,-attachdetach (or uninstall latch's attachdetach-controller). Check its flags with: kubectl -n kube-system get pods -l component=kube-controller-manager -o jsonpath='{.items[*].spec.containers[*].command}'; see who wrote the example with: kubectl get volumeattachment %s --show-managed-fields -o jsonpath='{.metadata.managedFields[*].manager}'",
				example.Name)}}
	}
	older, newer, last := kcmDesc, latchDesc, kNew
	if created(lNew).Before(created(kOld)) {
		older, newer, last = latchDesc, kcmDesc, lNew
	}
	return []Finding{{Check: "controllers.coexist", Object: "VolumeAttachment " + last.Name, Status: StatusInfo,
		Message: fmt.Sprintf("VolumeAttachments of two attach/detach controllers, but all of one are older than all of the other (a past swap, not both at once): %s; then %s",
			older, newer),
		Hint: fmt.Sprintf("see the writers of VolumeAttachment %s with: kubectl get volumeattachment %s --show-managed-fields -o yaml", last.Name, last.Name)}}
}

// creator is the field manager that owns a VolumeAttachment's spec: the
// one that created it ("" when no entry owns it).
func creator(va *storagev1.VolumeAttachment) string {
	for _, e := range va.ManagedFields {
		if e.Subresource != "" || e.FieldsV1 == nil {
			continue
		}
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(e.FieldsV1.GetRawBytes(), &fields); err != nil {
			continue
		}
		if _, ok := fields["f:spec"]; ok {
			return e.Manager
		}
	}
	return ""
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }
