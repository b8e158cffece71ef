package decide

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/latchcsi/latch/internal/kube/kubenames"
)

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
	vol, pvName, blocked := attachVolume(obs, drv, tr)
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

// sourceSpec returns the PV spec to attach: the PV's, or the inline one.
func sourceSpec(obs Observed, tr Translator) (*v1.PersistentVolume, string, *Blocked) {
	src := obs.VA.Spec.Source
	switch {
	case src.PersistentVolumeName != nil && src.InlineVolumeSpec != nil:
		return nil, "", &Blocked{Reason: ReasonInvalidSource, Message: "spec.source sets both persistentVolumeName and inlineVolumeSpec; exactly one is allowed"}
	case src.PersistentVolumeName == nil && src.InlineVolumeSpec == nil:
		return nil, "", &Blocked{Reason: ReasonInvalidSource, Message: "spec.source sets neither persistentVolumeName nor inlineVolumeSpec; exactly one is required"}
	case src.InlineVolumeSpec != nil:
		return &v1.PersistentVolume{Spec: *src.InlineVolumeSpec}, "", nil
	}
	name := *src.PersistentVolumeName
	if name == "" {
		return nil, "", &Blocked{Reason: ReasonInvalidSource, Message: "spec.source.persistentVolumeName is empty"}
	}
	if obs.PV == nil {
		return nil, name, &Blocked{Reason: ReasonWaitingForPV, Message: fmt.Sprintf("PersistentVolume %q not found", name)}
	}
	// A PV being deleted is still the source of a detach (its spec is what
	// was published, and our PV finalizer keeps it while a VA refers to
	// it); only an attach refuses it (pvDeleting).
	return obs.PV, name, nil
}

// pvDeleting says why an attach must not publish the PV spec (sourceSpec)
// found for name: it is being deleted.
func pvDeleting(obs Observed, name string) *Blocked {
	if name == "" || obs.PV == nil || obs.PV.DeletionTimestamp == nil {
		return nil
	}
	return &Blocked{Reason: ReasonPVDeleting, Message: fmt.Sprintf("PersistentVolume %q is being deleted", name)}
}

// ResolveVolume returns what ControllerPublish/Unpublish need from a CSI
// PV spec (the PV's or an inline one, translated first when it is an
// in-tree one), or why it cannot be used; what names the VolumeAttachment
// for an inline spec's messages.
func ResolveVolume(pv *v1.PersistentVolume, drv DriverInfo, tr Translator, what string) (Volume, *Blocked) {
	migrated := false
	if pv.Spec.CSI == nil {
		if tr == nil || !tr.IsPVMigratable(pv) {
			return Volume{}, &Blocked{Reason: ReasonUnsupportedVolume, Message: fmt.Sprintf("%s is not a CSI volume and cannot be migrated to CSI", sourceName(pv, what))}
		}
		translated, err := tr.TranslateInTreePVToCSI(pv)
		if err != nil || translated == nil || translated.Spec.CSI == nil {
			return Volume{}, &Blocked{Reason: ReasonTranslationFailed, Message: fmt.Sprintf("translate %s to CSI: %v", sourceName(pv, what), err)}
		}
		pv, migrated = translated, true
	}
	c := pv.Spec.CSI
	if c.Driver != drv.Name {
		return Volume{}, &Blocked{Reason: ReasonUnsupportedVolume, Message: fmt.Sprintf("%s belongs to CSI driver %q, not %q", sourceName(pv, what), c.Driver, drv.Name)}
	}
	if c.VolumeHandle == "" {
		return Volume{}, &Blocked{Reason: ReasonUnsupportedVolume, Message: fmt.Sprintf("%s has an empty spec.csi.volumeHandle", sourceName(pv, what))}
	}
	vol := Volume{
		Handle:        c.VolumeHandle,
		VolumeContext: maps.Clone(c.VolumeAttributes),
		Secret:        c.ControllerPublishSecretRef,
		AccessModes:   pv.Spec.AccessModes,
		Block:         pv.Spec.VolumeMode != nil && *pv.Spec.VolumeMode == v1.PersistentVolumeBlock,
		FSType:        c.FSType,
		MountOptions:  pv.Spec.MountOptions,
		Migrated:      migrated,
	}
	if vol.FSType == "" && !vol.Block {
		vol.FSType = drv.DefaultFSType
	}
	// Readonly is only sent to drivers that declare PUBLISH_READONLY, as
	// upstream does; others reject or ignore it (internal/csi's
	// PublishReadOnly states the same rule; that package imports gRPC).
	vol.ReadOnly = c.ReadOnly && drv.SupportsReadOnly
	return vol, nil
}

func sourceName(pv *v1.PersistentVolume, what string) string {
	if pv.Name != "" {
		return fmt.Sprintf("PersistentVolume %q", pv.Name)
	}
	return "the inline volume of " + what
}

func vaName(va *storagev1.VolumeAttachment) string {
	return fmt.Sprintf("VolumeAttachment %q", va.Name)
}

// CSINodeID returns the node ID driver registered in csiNode.
func CSINodeID(csiNode *storagev1.CSINode, driver string) (string, bool) {
	if csiNode == nil {
		return "", false
	}
	for _, d := range csiNode.Spec.Drivers {
		if d.Name == driver && d.NodeID != "" {
			return d.NodeID, true
		}
	}
	return "", false
}

func csiNodeMessage(csiNode *storagev1.CSINode, node, driver string) string {
	if node == "" {
		return "spec.nodeName is empty"
	}
	if csiNode == nil {
		return fmt.Sprintf("CSINode %q not found: the driver's node plugin has not registered on node %q yet", node, node)
	}
	return fmt.Sprintf("CSINode %q does not contain driver %q: the driver's node plugin has not registered on that node yet", node, driver)
}

// CheckPublishContext says why a publish context the driver returned cannot
// be stored in status.attachmentMetadata, or returns nil when it can.
func CheckPublishContext(pc map[string]string) *Blocked {
	size := 0
	for k, v := range pc {
		size += len(k) + len(v)
	}
	if size <= MaxAttachmentMetadataBytes {
		return nil
	}
	return &Blocked{Reason: ReasonPublishContextTooLarge, Message: fmt.Sprintf(
		publishContextTooLargePrefix+" of %d bytes (%d keys), too large for VolumeAttachment status.attachmentMetadata (the API server accepts at most %d bytes of keys and values); not published again while this error is recorded; deleting the VolumeAttachment unpublishes the volume",
		size, len(pc), MaxAttachmentMetadataBytes)}
}

// publishContextTooLargePrefix starts the attachError CheckPublishContext
// leads to; DecideAttach recognises the record by it.
const publishContextTooLargePrefix = "the driver published the volume but returned a publish context"

// recordedTooLarge returns the PublishContextTooLarge error recorded on
// va, if any. Publishing again would return the same publish context: the
// record stands until someone clears status.attachError or deletes the VA.
// Kept on the VA rather than in memory, it holds across restarts, resyncs
// and passes woken by our own writes.
func recordedTooLarge(va *storagev1.VolumeAttachment) *Blocked {
	if e := va.Status.AttachError; e != nil && strings.HasPrefix(e.Message, publishContextTooLargePrefix) {
		return &Blocked{Reason: ReasonPublishContextTooLarge, Message: e.Message}
	}
	return nil
}

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

// PublishHandle is the handle of the volume Attach resolves for obs, or
// false when Attach decides before it resolves one (a trivial VA, a bad
// source, a PV being deleted or not a CSI volume). Attach judges only the
// pending publications of that handle (PublishBlockedByOrphan skips the
// others), so the attacher hands it only those: with --worker-threads
// publishes in flight it would otherwise copy and sort all of them on
// every attach pass.
func PublishHandle(obs Observed, drv DriverInfo, tr Translator) (string, bool) {
	if obs.Trivial {
		return "", false
	}
	vol, _, blocked := attachVolume(obs, drv, tr)
	return vol.Handle, blocked == nil
}

// attachVolume is the volume an attach publishes for obs and its PV's
// name ("" for an inline volume), or why it cannot: a bad source, a PV
// being deleted, a volume that is not CSI and cannot be migrated.
func attachVolume(obs Observed, drv DriverInfo, tr Translator) (Volume, string, *Blocked) {
	spec, pvName, blocked := sourceSpec(obs, tr)
	if blocked == nil {
		blocked = pvDeleting(obs, pvName)
	}
	if blocked != nil {
		return Volume{}, "", blocked
	}
	vol, blocked := ResolveVolume(spec, drv, tr, vaName(obs.VA))
	if blocked != nil {
		return Volume{}, "", blocked
	}
	return vol, pvName, nil
}

// The second half of a decision, made only when a plan calls the driver:
// the facts it needs are costly (an API read of the Secret) or built with
// the CSI types this package may not import (the VolumeCapability), so the
// pass reads them once a plan says it will call, and WithCallFacts and
// DetachWithCallFacts mark in the plan the calls BeforeCall forbids. The
// executor makes a call only when its plan allows it.

// BeforeCall decides whether the driver may be called now, or why not: a
// missing or unreadable secret (ClassWaitForObject: polled, secrets are
// not watched) comes first, then a capability the access modes cannot be
// mapped to (ClassRetry: a PV's access modes are immutable, but the
// VolumeAttachment's attachError says why it is not attached). Nil: call.
func BeforeCall(f CallFacts) *Blocked {
	switch ref := f.Secret; {
	case ref != nil && f.SecretState == SecretNotFound:
		return &Blocked{Reason: ReasonWaitingForSecret, Message: fmt.Sprintf("controller publish secret %s/%s not found", ref.Namespace, ref.Name)}
	case ref != nil && f.SecretState == SecretForbidden:
		return &Blocked{Reason: ReasonSecretForbidden, Message: fmt.Sprintf(
			"controller publish secret %s/%s: csi-attacher is not allowed to read it (%s); grant its ServiceAccount a Role with verbs [get] on resource secrets in namespace %q",
			ref.Namespace, ref.Name, f.SecretDenial, ref.Namespace)}
	case f.CapabilityErr != nil:
		return &Blocked{Reason: ReasonInvalidCapabilities, Message: f.CapabilityErr.Error()}
	}
	return nil
}

// CallsDriver reports whether plan calls the driver (ControllerPublish, and
// the unpublish of a publication recorded under an old node ID before it):
// only then are its call facts read.
func (plan AttachPlan) CallsDriver() bool { return plan.Publish || plan.UnpublishFirst != nil }

// WithCallFacts returns plan with the calls f forbids marked: PublishBlocked
// for ControllerPublish (BeforeCall on every fact), UnpublishFirst.Blocked
// for the unpublish before it, which sends no capability (BeforeCall on the
// secret alone).
func WithCallFacts(plan AttachPlan, f CallFacts) AttachPlan {
	if plan.Publish {
		plan.PublishBlocked = BeforeCall(f)
	}
	if u := plan.UnpublishFirst; u != nil {
		withoutCapability := f
		withoutCapability.CapabilityErr = nil
		cp := *u
		cp.Blocked = BeforeCall(withoutCapability)
		plan.UnpublishFirst = &cp
	}
	return plan
}

// What a ControllerPublish led to, decided from what the executor saw:
// the driver's answer (Published), what the status write after it
// answered and, when that tells nothing certain, a live read of the
// VolumeAttachment (Fate). The executor makes the call, the write and the
// read; these functions decide what they mean, in three steps:
//
//	rec := AfterPublish(answer)        // what to write: attached, or which attachError
//	fate, read := VAFate(facts)        // read: make a live read, then ask again
//	out := PublishOutcome(answer, fate, writeFailed)

// AfterPublish decides what the status write after a publish records. A
// publish context too large for status.attachmentMetadata is a failure
// (the API server would refuse the write, and publishing again would only
// publish again); the finalizer stays, so a delete still unpublishes.
func AfterPublish(p Published) PublishRecord {
	switch {
	case p.Err != nil:
		return PublishRecord{MayBePublished: !p.Final}
	}
	if b := CheckPublishContext(p.Context); b != nil {
		return PublishRecord{Blocked: b, MayBePublished: true}
	}
	return PublishRecord{Attached: true}
}

// VAFate decides what became of the VolumeAttachment f.UID after a
// publish, or says that a live read is needed first (read: make it, put it
// in f.Live and ask again).
func VAFate(f FateFacts) (fate Fate, read bool) {
	switch f.Write {
	case WriteNotFound:
		return FateGone, false
	case WriteFailed:
		return FateUnknown, false
	case WriteRefused, WriteUnneeded:
		switch {
		case !f.Live.Made:
			return FateUnknown, true
		case f.Live.Failed:
			return FateUnknown, false
		case PublishedForGone(f.Live.VA, f.UID, f.Driver):
			return FateGone, false
		}
		return FateKept, false
	}
	if w := f.Written; w != nil && w.UID == f.UID && PublishedForGone(w, f.UID, f.Driver) {
		return FateGone, false
	}
	return FateKept, false
}

// PublishOutcome decides what a publish came to from its answer p, the
// fate of its VolumeAttachment (VAFate; not consulted after a final
// driver error, which published nothing) and whether the status write
// failed.
func PublishOutcome(p Published, fate Fate, writeFailed bool) Outcome {
	rec := AfterPublish(p)
	if rec.Attached || rec.MayBePublished {
		uncertain := p.Err != nil
		switch fate {
		case FateGone:
			return Outcome{Kind: OutcomeOrphaned, Uncertain: uncertain}
		case FateUnknown:
			return Outcome{Kind: OutcomeSuspect, Uncertain: uncertain}
		}
	}
	switch {
	case writeFailed:
		return Outcome{Kind: OutcomeWriteFailed}
	case rec.Attached:
		return Outcome{Kind: OutcomeAttached}
	case p.Throttled && !p.Final:
		return Outcome{Kind: OutcomeThrottled}
	}
	return Outcome{Kind: OutcomeFailed, Terminal: rec.Blocked != nil && rec.Blocked.Reason.Class() == ClassTerminal}
}
