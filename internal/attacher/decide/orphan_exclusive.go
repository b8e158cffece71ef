package decide

import (
	"fmt"
	"slices"

	v1 "k8s.io/api/core/v1"
)

// SingleNode reports whether a volume with these access modes may be
// published to one node only: ReadWriteOnce (SINGLE_NODE_WRITER, or
// SINGLE_NODE_MULTI_WRITER with that capability) and ReadWriteOncePod.
// The attach/detach controller calls the same volumes exclusive
// (attachdetach/volume.MultiAttachAllowed): access modes that are known
// and include neither ReadWriteMany nor ReadOnlyMany.
func SingleNode(modes []v1.PersistentVolumeAccessMode) bool {
	return len(modes) > 0 && !slices.Contains(modes, v1.ReadWriteMany) && !slices.Contains(modes, v1.ReadOnlyMany)
}

// PublishBlockedByOrphan says why a ControllerPublish of vol to nodeID must
// wait, or returns nil. It must wait while a publication of the same
// volume handle to another node ID is still to be undone (an orphan: its
// VolumeAttachment was deleted, without a detach, while the driver
// published it) or may be (a suspect, or a publish in flight whose
// VolumeAttachment may be force-deleted meanwhile), when the volume may be
// on one node only: its access modes now, or those of the orphan's
// publish, say so.
// The attach/detach controller cannot see such a publication (no
// VolumeAttachment stands for it) and attaches the volume elsewhere at
// once; publishing it there would put a single-node volume on two nodes.
// pending is every orphan and suspect of the driver, in a stable order;
// the first that blocks is named.
func PublishBlockedByOrphan(vol Volume, nodeID string, pending []Orphan) *Blocked {
	single := SingleNode(vol.AccessModes)
	for _, o := range pending {
		if o.Handle != vol.Handle || o.NodeID == nodeID || !(single || o.SingleNode) {
			continue
		}
		return &Blocked{Reason: ReasonOrphanOnOtherNode, Message: orphanElsewhereMessage(vol, nodeID, o)}
	}
	return nil
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
