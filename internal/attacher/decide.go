// Package attacher is the csi-attacher sidecar: it turns VolumeAttachments
// whose spec.attacher names our driver into ControllerPublishVolume and
// ControllerUnpublishVolume calls.
//
// The package is split the way the project splits every controller: decide*
// functions are pure (observed objects in, plan out; no clients, no clock),
// the executor carries a plan out against the API server and the driver, and
// the controller owns informers, queues and event filtering.
package attacher

import (
	"fmt"
	"maps"
	"strings"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/csi"
	"github.com/latchcsi/latch/internal/kube"
)

// Annotations latch adds to a VolumeAttachment, next to upstream's node-id
// annotation, so that detach never depends on objects that may be gone by
// then (a deleted PV used to leave upstream's attacher stuck forever).
const (
	// AnnVolumeHandle is the CSI volume handle the volume was published with.
	AnnVolumeHandle = "attacher.latch.dev/volume-handle"
	// AnnSecretRef is "namespace/name" of the controller-publish secret, if any.
	AnnSecretRef = "attacher.latch.dev/controller-publish-secret"
)

// DriverInfo is what the decision needs to know about the driver.
type DriverInfo struct {
	Name string
	// SupportsReadOnly is PUBLISH_READONLY.
	SupportsReadOnly bool
	// SupportsSingleNodeMultiWriter is SINGLE_NODE_MULTI_WRITER.
	SupportsSingleNodeMultiWriter bool
	// DefaultFSType is --default-fstype, used when the PV names none.
	DefaultFSType string
}

// Observed is the state one decision is made from. Nil pointers mean "not
// found"; the caller never passes objects it failed to read for another
// reason (it retries instead).
type Observed struct {
	VA      *storagev1.VolumeAttachment
	PV      *v1.PersistentVolume // for spec.source.persistentVolumeName
	CSINode *storagev1.CSINode   // for spec.nodeName
}

// Reason classifies why an attach or detach cannot go on. It decides how the
// controller retries: WaitingFor* reasons are retried promptly when the
// object they wait for changes; Invalid reasons only when the
// VolumeAttachment itself changes.
type Reason string

const (
	ReasonInvalidSource       Reason = "InvalidSource"
	ReasonWaitingForPV        Reason = "WaitingForPV"
	ReasonPVDeleting          Reason = "PVDeleting"
	ReasonUnsupportedVolume   Reason = "UnsupportedVolume"
	ReasonWaitingForCSINode   Reason = "WaitingForCSINode"
	ReasonNoVolumeHandle      Reason = "NoVolumeHandle"
	ReasonTranslationFailed   Reason = "TranslationFailed"
	ReasonInvalidCapabilities Reason = "InvalidCapabilities"
	// ReasonPublishContextTooLarge: the driver published the volume but its
	// publish context does not fit in status.attachmentMetadata. Not
	// published again while the attachError that says so is on the VA
	// (recordedTooLarge): publishing again would get the same answer.
	ReasonPublishContextTooLarge Reason = "PublishContextTooLarge"
)

// MaxAttachmentMetadataBytes is the API server's limit on
// VolumeAttachment status.attachmentMetadata: the sum of the lengths of
// its keys and values (k8s.io/kubernetes/pkg/apis/storage/validation,
// maxAttachedVolumeMetadataSize).
const MaxAttachmentMetadataBytes = 256 * 1024

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

// Blocked says why nothing can be done yet; Message goes into the
// VolumeAttachment's attachError/detachError as is.
type Blocked struct {
	Reason  Reason
	Message string
}

func (b *Blocked) Error() string { return b.Message }

// Volume is what ControllerPublish/Unpublish need, resolved from the PV, the
// inline spec, or (detach only) the annotations latch left on the VA.
type Volume struct {
	Handle        string
	ReadOnly      bool
	VolumeContext map[string]string
	// Secret is the controller-publish secret reference, nil when none.
	Secret *v1.SecretReference
	// Access modes, volume mode, fsType and mount options of the PV: the
	// executor turns them into a CSI VolumeCapability.
	AccessModes  []v1.PersistentVolumeAccessMode
	Block        bool
	FSType       string
	MountOptions []string
	// Migrated is true when the volume was translated from an in-tree spec.
	Migrated bool
}

// AttachPlan is the outcome of DecideAttach. Exactly one of Blocked,
// Done or the write/publish steps applies. Steps run in order: PV
// finalizer, UnpublishFirst, VA metadata, ControllerPublish, status.
type AttachPlan struct {
	Blocked *Blocked
	// Done: the VA is attached and carries everything it should; nothing to do.
	Done bool
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

// Translator turns in-tree volume specs into CSI ones (CSI migration).
type Translator interface {
	// IsPVMigratable reports whether pv is an in-tree PV with a CSI driver
	// to migrate to.
	IsPVMigratable(pv *v1.PersistentVolume) bool
	// TranslateInTreePVToCSI returns a copy of pv with spec.csi set.
	TranslateInTreePVToCSI(logger klog.Logger, pv *v1.PersistentVolume) (*v1.PersistentVolume, error)
}

// DecideAttach decides the next steps to attach obs.VA. The VA must be one of
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
func DecideAttach(obs Observed, drv DriverInfo, tr Translator) AttachPlan {
	va := obs.VA
	if b := recordedTooLarge(va); b != nil && !believed(va, drv.Name) {
		return AttachPlan{Blocked: b}
	}
	spec, pvName, blocked := sourceSpec(obs, tr)
	if blocked != nil {
		return AttachPlan{Blocked: blocked}
	}
	vol, blocked := volumeFromSpec(spec, drv, tr, vaName(va))
	if blocked != nil {
		return AttachPlan{Blocked: blocked}
	}
	recordedNodeID := va.Annotations[kube.VANodeIDAnnotation]
	ourFinalizer := hasString(va.Finalizers, kube.AttacherFinalizer(drv.Name))

	var plan AttachPlan
	if believed(va, drv.Name) {
		// Attached by us: the node ID it was published with stays; only
		// what is missing (PV finalizer, handle annotation) is added.
		plan = AttachPlan{Volume: vol, NodeID: recordedNodeID}
	} else {
		nodeID, ok := csiNodeID(obs.CSINode, drv.Name)
		if !ok {
			return AttachPlan{Blocked: &Blocked{Reason: ReasonWaitingForCSINode, Message: csiNodeMessage(obs.CSINode, va.Spec.NodeName, drv.Name)}}
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
		if pv := obs.PV; !hasString(pv.Finalizers, kube.PVFinalizer(drv.Name)) {
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
	return va.Status.Attached && hasString(va.Finalizers, kube.AttacherFinalizer(driver)) && va.Annotations[kube.VANodeIDAnnotation] != ""
}

// metadataFor returns the finalizer and annotations va lacks, or nil.
func metadataFor(va *storagev1.VolumeAttachment, driver, nodeID string, vol Volume) *MetadataChange {
	want := map[string]string{
		kube.VANodeIDAnnotation: nodeID,
		AnnVolumeHandle:         vol.Handle,
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
	if !hasString(va.Finalizers, kube.AttacherFinalizer(driver)) {
		mc.AddFinalizer = kube.AttacherFinalizer(driver)
	}
	if mc.AddFinalizer == "" && len(mc.SetAnnotations) == 0 {
		return nil
	}
	if len(mc.SetAnnotations) == 0 {
		mc.SetAnnotations = nil
	}
	return mc
}

// DetachPlan is the outcome of DecideDetach.
type DetachPlan struct {
	Blocked *Blocked
	// Done: our finalizer is not on the VA; nothing to do.
	Done   bool
	Volume Volume
	NodeID string
}

// DecideDetach decides how to detach obs.VA, which is being deleted. The
// volume comes from the live PV or inline spec, falling back to the
// annotations written at attach time, so a VA whose PV is gone can still be
// unpublished and released; the node ID comes from the node-id annotation
// (the ID the volume was published with), falling back to the live CSINode
// only when there is none.
func DecideDetach(obs Observed, drv DriverInfo, tr Translator) DetachPlan {
	va := obs.VA
	if !hasString(va.Finalizers, kube.AttacherFinalizer(drv.Name)) {
		return DetachPlan{Done: true}
	}
	var vol Volume
	spec, _, blocked := sourceSpec(obs, tr)
	if blocked == nil {
		vol, blocked = volumeFromSpec(spec, drv, tr, vaName(va))
	}
	if blocked != nil {
		// The live source is unusable (PV deleted, say): use what attach
		// recorded.
		handle := va.Annotations[AnnVolumeHandle]
		if handle == "" {
			return DetachPlan{Blocked: &Blocked{Reason: ReasonNoVolumeHandle, Message: fmt.Sprintf(
				"cannot detach: %s, and the VolumeAttachment has no %s annotation to fall back on", blocked.Message, AnnVolumeHandle)}}
		}
		vol = Volume{Handle: handle, Secret: parseSecretRef(va.Annotations[AnnSecretRef])}
	}
	// The node ID the volume was published with is the one to unpublish:
	// a node replaced under the same name registers a new ID in its
	// CSINode, and unpublishing that one would leave the old publication
	// forever. The live CSINode only stands in when nothing was recorded.
	nodeID := va.Annotations[kube.VANodeIDAnnotation]
	if nodeID == "" {
		var ok bool
		if nodeID, ok = csiNodeID(obs.CSINode, drv.Name); !ok {
			return DetachPlan{Blocked: &Blocked{Reason: ReasonWaitingForCSINode, Message: fmt.Sprintf(
				"cannot detach: %s, and the VolumeAttachment has no %s annotation", csiNodeMessage(obs.CSINode, va.Spec.NodeName, drv.Name), kube.VANodeIDAnnotation)}}
		}
	}
	return DetachPlan{Volume: vol, NodeID: nodeID}
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
	if obs.PV.DeletionTimestamp != nil {
		return nil, name, &Blocked{Reason: ReasonPVDeleting, Message: fmt.Sprintf("PersistentVolume %q is being deleted", name)}
	}
	return obs.PV, name, nil
}

func volumeFromSpec(pv *v1.PersistentVolume, drv DriverInfo, tr Translator, what string) (Volume, *Blocked) {
	migrated := false
	if pv.Spec.CSI == nil {
		if tr == nil || !tr.IsPVMigratable(pv) {
			return Volume{}, &Blocked{Reason: ReasonUnsupportedVolume, Message: fmt.Sprintf("%s is not a CSI volume and cannot be migrated to CSI", sourceName(pv, what))}
		}
		translated, err := tr.TranslateInTreePVToCSI(klog.Background(), pv)
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
	// upstream does; others reject or ignore it.
	vol.ReadOnly = csi.PublishReadOnly(c.ReadOnly, csi.Capabilities{PublishReadonly: drv.SupportsReadOnly})
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

func csiNodeID(csiNode *storagev1.CSINode, driver string) (string, bool) {
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

func parseSecretRef(s string) *v1.SecretReference {
	for i := 0; i < len(s); i++ {
		if s[i] == '/' {
			return &v1.SecretReference{Namespace: s[:i], Name: s[i+1:]}
		}
	}
	return nil
}

func hasString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
