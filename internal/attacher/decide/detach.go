package decide

import (
	"fmt"
	"slices"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// DetachPlan is the outcome of Detach.
type DetachPlan struct {
	Blocked *Blocked
	// Done: our finalizer is not on the VA; nothing to do.
	Done bool
	// CallBlocked: ControllerUnpublish may not be called (BeforeCall,
	// marked by DetachWithCallFacts); the executor records why instead.
	CallBlocked *Blocked
	Volume      Volume
	NodeID      string
}

// Detach decides how to detach obs.VA, which is being deleted: nothing
// once our finalizer is gone, unless the driver still lists the volume as
// published on the node (obs.StillPublished) or the VA is still marked
// attached with the volume handle and node ID latch recorded (our
// finalizer was removed by another client while, or after, the volume was
// published: no other detach will come for it). The volume comes from the
// live PV (being deleted or not: its spec is what was published) or inline
// spec, falling back to the annotations written at attach time, so a VA
// whose PV is gone can still be unpublished and released; the node ID
// comes from the node-id annotation (the ID the volume was published
// with), falling back to the live CSINode only when there is none.
func Detach(obs Observed, drv DriverInfo, tr Translator) DetachPlan {
	va := obs.VA
	ours := slices.Contains(va.Finalizers, kubenames.AttacherFinalizer(drv.Name))
	if obs.Trivial {
		if !ours {
			// Nothing was published and no finalizer was added.
			return DetachPlan{Done: true}
		}
		return DetachPlan{Blocked: noUnpublishCapability(va, drv.Name)}
	}
	if !ours && !obs.StillPublished && !recordedAttached(va) {
		return DetachPlan{Done: true}
	}
	var vol Volume
	spec, _, blocked := sourceSpec(obs, tr)
	if blocked == nil {
		vol, blocked = ResolveVolume(spec, drv, tr, vaName(va))
	}
	if blocked != nil {
		// The live source is unusable (PV deleted, say): use what attach
		// recorded.
		handle := va.Annotations[AnnVolumeHandle]
		if handle == "" {
			return DetachPlan{Blocked: &Blocked{Reason: ReasonNoVolumeHandle, Message: fmt.Sprintf(
				"cannot detach: %s, and the VolumeAttachment has no %s annotation to fall back on", blocked.Message, AnnVolumeHandle)}}
		}
		vol = Volume{Handle: handle, Secret: ParseSecretRef(va.Annotations[AnnSecretRef])}
	}
	// The node ID the volume was published with is the one to unpublish:
	// a node replaced under the same name registers a new ID in its
	// CSINode, and unpublishing that one would leave the old publication
	// forever. The live CSINode only stands in when nothing was recorded.
	nodeID := va.Annotations[kubenames.VANodeIDAnnotation]
	if nodeID == "" {
		var ok bool
		if nodeID, ok = CSINodeID(obs.CSINode, drv.Name); !ok {
			return DetachPlan{Blocked: &Blocked{Reason: ReasonWaitingForCSINode, Message: fmt.Sprintf(
				"cannot detach: %s, and the VolumeAttachment has no %s annotation", csiNodeMessage(obs.CSINode, va.Spec.NodeName, drv.Name), kubenames.VANodeIDAnnotation)}}
		}
	}
	return DetachPlan{Volume: vol, NodeID: nodeID}
}

// recordedAttached reports whether va, being deleted without our
// finalizer, is still marked attached with the volume handle and node ID
// latch records before every publish, and is kept by another finalizer:
// the volume is published (latch's status write said so) and nothing else
// will detach it. A deleting VA without any finalizer is gone from the API
// server: it is the answer to our own removal of the last finalizer (the
// detach that ended), not an object to detach again.
func recordedAttached(va *storagev1.VolumeAttachment) bool {
	return va.Status.Attached && len(va.Finalizers) > 0 &&
		va.Annotations[AnnVolumeHandle] != "" && va.Annotations[kubenames.VANodeIDAnnotation] != ""
}

// noUnpublishCapability is why a VA that carries our finalizer cannot be
// detached in trivial mode: it was attached while the driver had
// PUBLISH_UNPUBLISH_VOLUME, which it no longer reports, so
// ControllerUnpublishVolume cannot be called. The finalizer stays: only
// someone who knows whether the volume is still published can let it go.
func noUnpublishCapability(va *storagev1.VolumeAttachment, driver string) *Blocked {
	nodeID := va.Annotations[kubenames.VANodeIDAnnotation]
	if nodeID == "" {
		nodeID = "(not recorded)"
	}
	return &Blocked{Reason: ReasonUnpublishUnsupported, Message: fmt.Sprintf(
		"cannot detach: the VolumeAttachment carries finalizer %q, added while driver %q supported PUBLISH_UNPUBLISH_VOLUME; the driver no longer reports that capability, so ControllerUnpublishVolume cannot be called and the volume may still be published to node ID %q. Restore the capability and restart csi-attacher, or make sure the volume is unpublished and remove the finalizer by hand",
		kubenames.AttacherFinalizer(driver), driver, nodeID)}
}

// ParseSecretRef parses "namespace/name" (the AnnSecretRef annotation); nil
// when s has no slash.
func ParseSecretRef(s string) *v1.SecretReference {
	for i := 0; i < len(s); i++ {
		if s[i] == '/' {
			return &v1.SecretReference{Namespace: s[:i], Name: s[i+1:]}
		}
	}
	return nil
}

// CallsDriver reports whether plan calls ControllerUnpublish.
func (plan DetachPlan) CallsDriver() bool { return !plan.Done && plan.Blocked == nil }

// DetachWithCallFacts returns plan with CallBlocked set when f forbids the
// ControllerUnpublish (BeforeCall: a missing or forbidden secret).
func DetachWithCallFacts(plan DetachPlan, f CallFacts) DetachPlan {
	if plan.CallsDriver() {
		f.CapabilityErr = nil
		plan.CallBlocked = BeforeCall(f)
	}
	return plan
}
