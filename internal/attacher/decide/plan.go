package decide

import (
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/types"
)

// The plans and outcomes of csi-attacher's decisions, and the facts they
// are decided from beyond Observed (input.go).

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
	// PublishBlocked: ControllerPublish may not be called (BeforeCall,
	// marked by WithCallFacts); the executor records why instead.
	PublishBlocked *Blocked
	Volume         Volume
	NodeID         string
}

// Unpublication is one ControllerUnpublish of a recorded publication.
type Unpublication struct {
	Handle, NodeID string
	// Blocked: the unpublish may not be called (BeforeCall, marked by
	// WithCallFacts); the executor records why instead.
	Blocked *Blocked
}

// MetadataChange is one guarded write of finalizers and annotations.
type MetadataChange struct {
	AddFinalizer   string
	SetAnnotations map[string]string
}

// SecretState is what reading a controller-publish secret found.
type SecretState int

const (
	// SecretNone: the volume names no secret, or it was read.
	SecretNone SecretState = iota
	// SecretNotFound: the Secret does not exist (yet).
	SecretNotFound
	// SecretForbidden: csi-attacher may not read it.
	SecretForbidden
)

// CallFacts are read only when a plan is about to call the driver.
type CallFacts struct {
	// Secret is the volume's controller-publish secret reference (nil:
	// none) and SecretState what reading it found; SecretDenial is the
	// API server's message when it refused the read.
	Secret       *v1.SecretReference
	SecretState  SecretState
	SecretDenial string
	// CapabilityErr is why the CSI VolumeCapability for the volume could
	// not be built (ControllerPublish only; nil when it could, or for an
	// unpublish, which sends none).
	CapabilityErr error
}

// Published is a ControllerPublish's answer as the executor classified it
// (internal/csi owns which gRPC codes are final; Throttled, retry.go, which
// are the backend pushing back).
type Published struct {
	// Err is the driver's error; nil: the volume is published.
	Err error
	// Final: Err is final (nothing was published). Otherwise the call may
	// still be in progress and the volume may be published.
	Final bool
	// Throttled: Err is the backend pushing back (Throttled of its code:
	// ResourceExhausted, Unavailable); a Throttled answer is never Final.
	Throttled bool
	// Context is the publish context of a successful call.
	Context map[string]string
}

// PublishRecord is what the status write after a publish records.
type PublishRecord struct {
	// Attached: write status.attached=true with the publish context.
	// Otherwise write the failure in status.attachError: Blocked's message
	// when set (the publish context cannot be stored), the driver's error
	// otherwise.
	Attached bool
	Blocked  *Blocked
	// MayBePublished: the failure leaves a publication that was, or may
	// have been, made, so what became of the VolumeAttachment meanwhile
	// matters (VAFate): gone, the publication is an orphan.
	MayBePublished bool
}

// Fate is what became of the VolumeAttachment a publication was made for,
// as far as the status write's answer and a live read tell.
type Fate int

const (
	// FateKept: the object is there (same UID) and a detach of ours will
	// come for it, or it is not deleting.
	FateKept Fate = iota
	// FateGone: gone, replaced by another object of the same name, or
	// deleting without our finalizer (PublishedForGone): the publication
	// is an orphan.
	FateGone
	// FateUnknown: the write failed for a reason that tells neither, and
	// nothing read the object since: the next pass of its name decides
	// (a suspect).
	FateUnknown
)

var fateNames = [...]string{"Kept", "Gone", "Unknown"}

func (f Fate) String() string {
	if int(f) >= 0 && int(f) < len(fateNames) {
		return fateNames[f]
	}
	return "Fate(?)"
}

// StatusWrite is how the status write after a publish answered.
type StatusWrite int

const (
	// WriteSent: the write went through.
	WriteSent StatusWrite = iota
	// WriteUnneeded: the object already showed that status, so nothing
	// was sent and no UID precondition was checked.
	WriteUnneeded
	// WriteNotFound: the object is gone.
	WriteNotFound
	// WriteRefused: 422 or 409. The status patch carries the object's UID
	// as a precondition (a patch whose metadata.uid differs from the
	// stored object's is refused with 422, metadata.uid: field is
	// immutable); both codes have other causes too, so a live read tells.
	WriteRefused
	// WriteFailed: any other failure (a 500, a timeout): it tells nothing.
	WriteFailed
)

// Sighting is a live read of the VolumeAttachment from the API server.
type Sighting struct {
	// Made: the read was made; Failed: it failed.
	Made, Failed bool
	// VA is what it returned; nil: not found.
	VA *storagev1.VolumeAttachment
}

// FateFacts is what VAFate decides from.
type FateFacts struct {
	// UID is the VolumeAttachment the publication was made for; Driver is
	// ours (its finalizer).
	UID    types.UID
	Driver string
	Write  StatusWrite
	// Written is the object a sent write returned, when its finalizer is
	// to be judged (after a failed publish: another client may have
	// removed it while the driver published); nil: not judged.
	Written *storagev1.VolumeAttachment
	Live    Sighting
}

// OutcomeKind is what an attach's publish came to.
type OutcomeKind int

const (
	// OutcomeAttached: the volume is published and status.attached=true
	// is on the VolumeAttachment (written, or already there).
	OutcomeAttached OutcomeKind = iota
	// OutcomeOrphaned: the VolumeAttachment went away (or was replaced)
	// while the driver published: nothing will detach that publication,
	// so the pass makes it an orphan, to be undone.
	OutcomeOrphaned
	// OutcomeSuspect: whether the VolumeAttachment is still there is not
	// known: the publication is remembered until a read tells, and the
	// pass fails so that its retry reads.
	OutcomeSuspect
	// OutcomeWriteFailed: the status write failed (the object is still
	// there): retried with backoff.
	OutcomeWriteFailed
	// OutcomeFailed: the failure is recorded in status.attachError;
	// retried with backoff (Terminal: only an edit of the
	// VolumeAttachment can change it).
	OutcomeFailed
	// OutcomeThrottled: the backend pushed back; the failure is recorded
	// and retried after the backend's latency, without growing the
	// VolumeAttachment's backoff (which is for volumes that fail).
	OutcomeThrottled
)

var outcomeNames = [...]string{"Attached", "Orphaned", "Suspect", "WriteFailed", "Failed", "Throttled"}

func (k OutcomeKind) String() string {
	if int(k) >= 0 && int(k) < len(outcomeNames) {
		return outcomeNames[k]
	}
	return "OutcomeKind(?)"
}

// Outcome is what PublishOutcome decides.
type Outcome struct {
	Kind OutcomeKind
	// Uncertain (orphans and suspects): the driver's answer left it open
	// whether it published at all.
	Uncertain bool
	// Terminal (OutcomeFailed): not retried until the VolumeAttachment
	// changes.
	Terminal bool
}
