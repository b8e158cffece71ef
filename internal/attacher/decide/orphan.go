package decide

import (
	"fmt"
	"slices"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// Orphan is what the decisions about an orphaned publication need: a
// publication (or a possible one) made for a VolumeAttachment that no
// detach of ours will ever come for.
type Orphan struct {
	Handle, NodeID string
	// VA and UID name the VolumeAttachment the publication was made for;
	// NodeName is its spec.nodeName ("" when a record does not say).
	VA, NodeName string
	UID          types.UID
	// PV is the PersistentVolume the volume was published from: "" for an
	// inline volume, or for a record an older attacher wrote.
	PV string
	// Uncertain: the publish failed with a code that leaves its outcome
	// unknown, and no unpublish has been answered with a final code since.
	// The driver may still be carrying the publish out, so a listing that
	// does not show the volume proves nothing.
	Uncertain bool
	// SingleNode: the publish was made with access modes that allow the
	// volume on one node only (SingleNode); false when not known (a
	// record read from the ConfigMap).
	SingleNode bool
	// Suspect: not known to be an orphan yet. The status write after the
	// publish failed for a reason that does not tell whether the
	// VolumeAttachment still exists; a live read of it decides.
	Suspect bool
	// Publishing: a ControllerPublish for it is in flight; its outcome,
	// and whether its VolumeAttachment is still there, are not known yet.
	Publishing bool
	// RecordProblem says why the orphan is not in the ConfigMap record
	// ("" when it is, or was not tried): a VolumeAttachment that waits for
	// it says so too.
	RecordProblem string
	// FromRecord: read from the ConfigMap record, not witnessed by this
	// process. Such an entry is a claim anyone who may write ConfigMaps in
	// the attacher's namespace can make: it is acted on only as far as
	// the API server and the driver corroborate it (SettleRecorded).
	FromRecord bool
}

// Ownership is how a VolumeAttachment relates to an orphaned publication.
type Ownership int

const (
	// NotOwner: the VolumeAttachment does not stand for the publication;
	// unpublishing it takes nothing away from it.
	NotOwner Ownership = iota
	// Owner: the VolumeAttachment carries our finalizer and records the
	// same volume and node ID: its own detach will undo the publication,
	// so the orphan is dropped without an unpublish.
	Owner
	// OwnerOnceRecorded: the VolumeAttachment will publish the same volume
	// to the same node ID, but does not carry our finalizer yet. Its attach
	// writes the finalizer before it publishes; until that write has
	// landed the orphan stays, so that a VolumeAttachment deleted before it
	// (no finalizer: gone at once) still leaves the volume to be
	// unpublished.
	OwnerOnceRecorded
)

func (o Ownership) String() string {
	switch o {
	case Owner:
		return "Owner"
	case OwnerOnceRecorded:
		return "OwnerOnceRecorded"
	}
	return "NotOwner"
}

// OrphanOwner says how obs.VA, a VolumeAttachment other than the one the
// orphan o was published for, relates to o. Only our finalizer makes a
// VolumeAttachment the owner: without it nothing keeps the object, and no
// detach would come when it is deleted.
func OrphanOwner(obs Observed, drv DriverInfo, tr Translator, o Orphan) Ownership {
	va := obs.VA
	if va == nil || va.Spec.Attacher != drv.Name {
		return NotOwner
	}
	ours := slices.Contains(va.Finalizers, kubenames.AttacherFinalizer(drv.Name))
	handle, nodeID := va.Annotations[AnnVolumeHandle], va.Annotations[kubenames.VANodeIDAnnotation]
	if va.DeletionTimestamp == nil && (handle == "" || nodeID == "") {
		// Not recorded yet (or attached by upstream, which records no
		// volume handle): what its attach publishes, or keeps, counts.
		plan := Attach(obs, drv, tr)
		if plan.Blocked != nil || plan.Done {
			return NotOwner
		}
		handle, nodeID = plan.Volume.Handle, plan.NodeID
	}
	switch {
	case handle != o.Handle || nodeID != o.NodeID:
		return NotOwner
	case ours:
		return Owner
	case va.DeletionTimestamp != nil:
		// Only a detach still to come (our finalizer) undoes it.
		return NotOwner
	}
	return OwnerOnceRecorded
}

// ForgetUnlisted reports whether a ListVolumes listing that began after
// the orphan o was found, and that does not show its volume published on
// its node ID (listed false), lets the attacher forget it. Not while its
// publish may still be under way (o.Uncertain): that publish may land
// after the listing, with nothing left to undo it. An entry read from the
// record is forgotten all the same: its uncertain flag cannot be checked,
// and it is never unpublished before a listing shows it (SettleOrphan), so
// keeping it would keep it for ever.
func ForgetUnlisted(o Orphan, listed bool) bool {
	return !listed && (!o.Uncertain || o.FromRecord)
}

// StillUncertain reports whether an uncertain orphan stays uncertain after
// an unpublish of it failed with an error of class final (csi.IsFinalError).
// A final answer means the driver had no operation pending on the volume
// (a conforming driver answers Aborted while one is: the CSI spec's
// per-volume serialization), so the publish is over one way or the other.
func StillUncertain(o Orphan, final bool) bool {
	return o.Uncertain && !final
}

// OrphanHoldsPV reports whether the orphan o keeps pv in use: its volume
// may still be published, so our PV finalizer must stay (the PV's deletion
// would otherwise delete a published volume). An orphan that names no PV
// (a record an older attacher wrote) is matched by our driver's volume
// handle.
func OrphanHoldsPV(o Orphan, pv *v1.PersistentVolume, driver string) bool {
	if o.PV != "" {
		return o.PV == pv.Name
	}
	c := pv.Spec.CSI
	return c != nil && c.Driver == driver && c.VolumeHandle != "" && c.VolumeHandle == o.Handle
}

// PublishedForGone decides, from a live read of the VolumeAttachment a
// publication was made for (live: nil when not found), whether that
// publication is orphaned: no detach of ours will come for it because the
// object is gone, was replaced by another of the same name (another
// UID), or is being deleted without our finalizer (removed by another
// client while the driver published).
func PublishedForGone(live *storagev1.VolumeAttachment, uid types.UID, driver string) bool {
	switch {
	case live == nil || live.UID != uid:
		return true
	case live.DeletionTimestamp != nil && !slices.Contains(live.Finalizers, kubenames.AttacherFinalizer(driver)):
		return true
	}
	return false
}

func orphanElsewhereMessage(vol Volume, nodeID string, o Orphan) string {
	where := fmt.Sprintf("node ID %q", o.NodeID)
	if o.NodeName != "" {
		where = fmt.Sprintf("node %q (node ID %q)", o.NodeName, o.NodeID)
	}
	why := "which was deleted or replaced while the driver published it, so no detach will undo it; csi-attacher unpublishes it itself"
	switch {
	case o.Suspect:
		why = "whose status write failed after the publish; whether that VolumeAttachment still exists is being checked"
	case o.Publishing:
		why = "whose ControllerPublish is in flight; it ends attached, or as a publication csi-attacher unpublishes itself"
	}
	modes := "its access modes"
	if len(vol.AccessModes) > 0 {
		modes = fmt.Sprintf("access modes %v", vol.AccessModes)
	}
	state := "is still published"
	if o.Uncertain || o.Suspect || o.Publishing {
		state = "may still be published"
	}
	msg := fmt.Sprintf("volume %q may be published to one node only (%s) and %s to %s for VolumeAttachment %q (uid %s), %s; ControllerPublish to node ID %q waits until that publication is unpublished",
		vol.Handle, modes, state, where, o.VA, o.UID, why, nodeID)
	if o.RecordProblem != "" {
		msg += "; that publication is tracked in memory only, and lost if csi-attacher restarts before it is unpublished: " + o.RecordProblem
	}
	return msg
}
