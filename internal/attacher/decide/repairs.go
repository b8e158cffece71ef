package decide

import (
	"slices"

	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// Repair is one disagreement between a VolumeAttachment and the driver.
type Repair struct {
	VA string
	// UID is the VA's as the listing judged it: a VolumeAttachment of the
	// same name made since is another object, not judged by that listing.
	UID    types.UID
	Action string // "republish" or "unpublish"
}

// Repairs is the pure part of the reconcile: given our VAs as they
// were before ListVolumes was called and what the driver reported, it lists
// the VAs to repair. Only VAs attached before the listing started are
// judged, so an attach that finished during the listing is never mistaken
// for a lost one.
func Repairs(before []*storagev1.VolumeAttachment, published map[string][]string, driver string) []Repair {
	var out []Repair
	for _, va := range before {
		handle, nodeID := va.Annotations[AnnVolumeHandle], va.Annotations[kubenames.VANodeIDAnnotation]
		if handle == "" || nodeID == "" {
			continue // never published by us
		}
		if action := RepairFor(va, slices.Contains(published[handle], nodeID), driver); action != "" {
			out = append(out, Repair{VA: va.Name, UID: va.UID, Action: action})
		}
	}
	return out
}

// RepairFor is the repair a VA needs when the driver does (published) or
// does not report its volume published on its node: "republish",
// "unpublish" or none.
func RepairFor(va *storagev1.VolumeAttachment, published bool, driver string) string {
	switch {
	case va.DeletionTimestamp == nil && va.Status.Attached && !published:
		return "republish"
	case va.DeletionTimestamp != nil && slices.Contains(va.Finalizers, kubenames.AttacherFinalizer(driver)) && published && va.Status.DetachError != nil:
		// A detach that failed waits out its backoff (up to
		// --retry-interval-max): retry it now. One that has not failed
		// is queued or in flight already; every deleting VA is still
		// published until its detach ends.
		return "unpublish"
	case va.DeletionTimestamp != nil && !slices.Contains(va.Finalizers, kubenames.AttacherFinalizer(driver)) && published:
		// Our detach ended (or our finalizer was removed by hand) and
		// another finalizer keeps the object, yet the driver lists the
		// volume on the node: no detach of ours will come, so unpublish
		// it now (Observed.StillPublished). Upstream's reconcile does the
		// same for a VA marked detached.
		return "unpublish"
	}
	return ""
}
