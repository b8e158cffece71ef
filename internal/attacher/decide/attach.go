package decide

import (
	"slices"

	storagev1 "k8s.io/api/storage/v1"

	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// AttachPlan is the outcome of Attach. Exactly one of Blocked, Done,
// Trivial or the write/publish steps applies. Steps run in order: PV
// finalizer, UnpublishFirst, VA metadata, ControllerPublish, status.
type AttachPlan struct {
	Blocked *Blocked
	// Done: the VA is attached and carries everything it should; nothing to do.
	Done bool
	// Trivial: the driver has no PUBLISH_UNPUBLISH_VOLUME; write only
	// status.attached=true (keeping status.attachmentMetadata).
	Trivial bool
	// AddPVFinalizer names the PV that needs our finalizer first.
	AddPVFinalizer string
	// UnpublishFirst is a publication recorded on the VA under another
	// node ID than the one the CSINode reports now (a node replaced under
	// the same name): it is unpublished before the VA's node-id annotation
	// is rewritten, so no publication is ever left without a record.
	UnpublishFirst *Unpublication
	// Metadata is the finalizer and annotations the VA must carry before the
	// driver is called; nil when it already has them.
	Metadata *MetadataChange
	// Publish: call ControllerPublish, then write status.attached=true.
	// False for a VA whose attached=true latch believes (see believed):
	// then only Metadata is written.
	Publish bool
	Volume  Volume
	NodeID  string
}

// Unpublication is one ControllerUnpublish of a recorded publication.
type Unpublication struct {
	Handle, NodeID string
}

// MetadataChange is one guarded write of finalizers and annotations.
type MetadataChange struct {
	AddFinalizer   string
	SetAnnotations map[string]string
}

// Attach decides the next steps to attach obs.VA. The VA must be one of
// ours and not being deleted.
//
// status.attached=true is believed only on a VA that carries what latch
// (or upstream's external-attacher, which uses the same names) writes
// before every publish: our finalizer and the node-id annotation. Any other
// attached=true was written by another client for a publication nobody
// recorded: it is treated as not attached, so the volume is published
// (ControllerPublish is idempotent) and latch's own status written.
//
// A believed attachment keeps the node ID it was published with, even when
// the CSINode now reports another one: rewriting the annotation would lose
// the only record of that publication. A VA that is not attached but
// recorded another node ID (with our finalizer, so it may have been
// published there) has that publication undone first.
//
// A publish of a volume that may be on one node only waits while a
// publication of the same handle to another node ID is still to be undone
// (obs.Pending, PublishBlockedByOrphan).
func Attach(obs Observed, drv DriverInfo, tr Translator) AttachPlan {
	va := obs.VA
	if obs.Trivial {
		// Nothing to publish: the VA is marked attached, its metadata kept.
		return AttachPlan{Trivial: true}
	}
	if b := recordedTooLarge(va); b != nil && !believed(va, drv.Name) {
		return AttachPlan{Blocked: b}
	}
	spec, pvName, blocked := sourceSpec(obs, tr)
	if blocked == nil {
		blocked = pvDeleting(obs, pvName)
	}
	if blocked != nil {
		return AttachPlan{Blocked: blocked}
	}
	vol, blocked := ResolveVolume(spec, drv, tr, vaName(va))
	if blocked != nil {
		return AttachPlan{Blocked: blocked}
	}
	recordedNodeID := va.Annotations[kubenames.VANodeIDAnnotation]
	ourFinalizer := slices.Contains(va.Finalizers, kubenames.AttacherFinalizer(drv.Name))

	var plan AttachPlan
	if believed(va, drv.Name) {
		// Attached by us: the node ID it was published with stays; only
		// what is missing (PV finalizer, handle annotation) is added.
		plan = AttachPlan{Volume: vol, NodeID: recordedNodeID}
	} else {
		nodeID, ok := CSINodeID(obs.CSINode, drv.Name)
		if !ok {
			return AttachPlan{Blocked: &Blocked{Reason: ReasonWaitingForCSINode, Message: csiNodeMessage(obs.CSINode, va.Spec.NodeName, drv.Name)}}
		}
		if b := PublishBlockedByOrphan(vol, nodeID, obs.Pending); b != nil {
			return AttachPlan{Blocked: b}
		}
		plan = AttachPlan{Volume: vol, NodeID: nodeID, Publish: true}
		if ourFinalizer && recordedNodeID != "" && recordedNodeID != nodeID {
			handle := va.Annotations[AnnVolumeHandle]
			if handle == "" {
				handle = vol.Handle
			}
			plan.UnpublishFirst = &Unpublication{Handle: handle, NodeID: recordedNodeID}
		}
	}
	if pvName != "" {
		if pv := obs.PV; !slices.Contains(pv.Finalizers, kubenames.PVFinalizer(drv.Name)) {
			plan.AddPVFinalizer = pv.Name
		}
	}
	plan.Metadata = metadataFor(va, drv.Name, plan.NodeID, vol)
	if !plan.Publish && plan.Metadata == nil && plan.AddPVFinalizer == "" {
		// Attached and fully recorded. The ListVolumes reconciler, not
		// this path, checks that the driver still agrees.
		return AttachPlan{Done: true}
	}
	return plan
}

// believed reports whether va's status.attached=true was written for a
// publication latch (or upstream's external-attacher) recorded: our
// finalizer and the node-id annotation go on the VA before every publish.
func believed(va *storagev1.VolumeAttachment, driver string) bool {
	return va.Status.Attached && slices.Contains(va.Finalizers, kubenames.AttacherFinalizer(driver)) && va.Annotations[kubenames.VANodeIDAnnotation] != ""
}

// metadataFor returns the finalizer and annotations va lacks, or nil.
func metadataFor(va *storagev1.VolumeAttachment, driver, nodeID string, vol Volume) *MetadataChange {
	want := map[string]string{
		kubenames.VANodeIDAnnotation: nodeID,
		AnnVolumeHandle:              vol.Handle,
	}
	if vol.Secret != nil {
		want[AnnSecretRef] = vol.Secret.Namespace + "/" + vol.Secret.Name
	}
	mc := &MetadataChange{SetAnnotations: map[string]string{}}
	for k, v := range want {
		if va.Annotations[k] != v {
			mc.SetAnnotations[k] = v
		}
	}
	if !slices.Contains(va.Finalizers, kubenames.AttacherFinalizer(driver)) {
		mc.AddFinalizer = kubenames.AttacherFinalizer(driver)
	}
	if mc.AddFinalizer == "" && len(mc.SetAnnotations) == 0 {
		return nil
	}
	if len(mc.SetAnnotations) == 0 {
		mc.SetAnnotations = nil
	}
	return mc
}
