package decide

import (
	"fmt"

	v1 "k8s.io/api/core/v1"
)

// The orphan record (the ConfigMap external-attacher-orphans-<driver>) is a
// memory, not an authority: anyone who may write ConfigMaps in the
// attacher's namespace can write an entry. What an entry says is therefore
// never enough to unpublish a volume or to choose a Secret:
//
//  1. An entry must name the VolumeAttachment (name and UID), the volume
//     handle, the node ID and the node name the publication was made for,
//     as every entry csi-attacher writes does. An entry that does not is
//     ignored (RecordedOrphanUnusable): never unpublished, never waited
//     for, reported as a Warning event.
//  2. A VolumeAttachment of ours that carries our finalizer and records
//     the same volume handle and node ID claims the publication: it is
//     never unpublished for the entry, which is dropped (its detach undoes
//     the publication). That VolumeAttachment is looked up by node ID as
//     well as by node name, and for an entry the one of the entry's own
//     name and UID counts too: only a publication this process saw made
//     leaves the object it was made for out (the API server told it that
//     object is gone; a cache that lags may still show it). One that will
//     publish the same volume to the same node ID, but has no finalizer
//     yet, makes the entry wait.
//  3. When the driver can list publications (LIST_VOLUMES_PUBLISHED_NODES,
//     the ListVolumes reconcile runs), an entry is unpublished only once a
//     listing has shown its volume published on its node ID; a listing
//     that does not show it forgets it (ForgetUnlisted). Without listing,
//     the API server's word (no claim, rule 2) is the corroboration: an
//     unpublish of a volume that is not published is a no-op by the CSI
//     spec, and one that a VolumeAttachment claims is never made.
//  4. The Secret handed to the driver is the controller-publish secret the
//     PersistentVolume names (RecordedOrphanSecret), resolved as the
//     attach path resolves it; the entry's secretRef is never read.
//
// A publication this process witnessed (it made the ControllerPublish, or
// read its failure) needs no corroboration beyond rule 2.

// Corroboration is what the API server and the driver say now about an
// orphan's publication.
type Corroboration struct {
	// Claim is the strongest relation of a VolumeAttachment of ours to
	// the orphan's volume handle and node ID (OrphanOwner): Owner over
	// OwnerOnceRecorded over NotOwner.
	Claim Ownership
	// CanList: the driver reports LIST_VOLUMES_PUBLISHED_NODES and the
	// ListVolumes reconcile runs.
	CanList bool
	// Listed: a ListVolumes listing showed the volume published on the
	// orphan's node ID since the orphan was known.
	Listed bool
}

// OrphanAction is what to do with a pending orphan now.
type OrphanAction int

const (
	// OrphanUnpublish: call ControllerUnpublish for it.
	OrphanUnpublish OrphanAction = iota
	// OrphanTakenOver: a VolumeAttachment with our finalizer claims the
	// publication; drop the orphan without an unpublish.
	OrphanTakenOver
	// OrphanWaitForOwner: a VolumeAttachment will claim it once our
	// finalizer lands on it; neither unpublish nor drop it yet.
	OrphanWaitForOwner
	// OrphanIgnored: an entry of the record that cannot be corroborated
	// (RecordedOrphanUnusable); drop it from memory, never unpublish it,
	// leave the entry for a person to look at.
	OrphanIgnored
	// OrphanWaitForListing: an entry of the record that no listing has
	// shown published yet; keep it, no unpublish, until a listing decides.
	OrphanWaitForListing
)

func (a OrphanAction) String() string {
	switch a {
	case OrphanTakenOver:
		return "TakenOver"
	case OrphanWaitForOwner:
		return "WaitForOwner"
	case OrphanIgnored:
		return "Ignored"
	case OrphanWaitForListing:
		return "WaitForListing"
	}
	return "Unpublish"
}

// SettleOrphan decides what to do with the orphan o given what the API
// server and the driver say (c), by the rules above.
func SettleOrphan(o Orphan, c Corroboration) OrphanAction {
	if RecordedOrphanUnusable(o) != "" {
		return OrphanIgnored
	}
	switch c.Claim {
	case Owner:
		return OrphanTakenOver
	case OwnerOnceRecorded:
		return OrphanWaitForOwner
	}
	if o.FromRecord && c.CanList && !c.Listed {
		return OrphanWaitForListing
	}
	return OrphanUnpublish
}

// RecordedOrphanUnusable says why an entry of the record can never be
// acted on (rule 1), or returns "" when it can (and for every orphan this
// process witnessed).
func RecordedOrphanUnusable(o Orphan) string {
	if !o.FromRecord {
		return ""
	}
	var missing []string
	for _, f := range []struct{ name, value string }{
		{"volumeAttachment", o.VA}, {"uid", string(o.UID)}, {"volumeHandle", o.Handle}, {"nodeID", o.NodeID}, {"nodeName", o.NodeName},
	} {
		if f.value == "" {
			missing = append(missing, f.name)
		}
	}
	if len(missing) == 0 {
		return ""
	}
	return fmt.Sprintf("the entry has no %v; every entry csi-attacher writes names the VolumeAttachment, its uid, the volume handle, the node ID and the node name, so this one was written by something else and nothing it says is acted on", missing)
}

// RecordedOrphanSecret returns the controller-publish secret an unpublish
// of the recorded orphan o uses (rule 4): the one pv, the PersistentVolume
// the entry names (nil when it is gone), names for o's volume handle and
// our driver, resolved as the attach path resolves it (translated for a
// migrated in-tree PV). nil when the PV is gone or is not the entry's
// volume: the unpublish is then made without secrets.
func RecordedOrphanSecret(o Orphan, pv *v1.PersistentVolume, drv DriverInfo, tr Translator) *v1.SecretReference {
	if pv == nil || o.PV == "" || pv.Name != o.PV {
		return nil
	}
	vol, blocked := ResolveVolume(pv, drv, tr, "")
	if blocked != nil || vol.Handle != o.Handle {
		return nil
	}
	return vol.Secret
}
