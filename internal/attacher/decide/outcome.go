package decide

import (
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/types"
)

// What a ControllerPublish led to, decided from what the executor saw:
// the driver's answer (Published), what the status write after it
// answered and, when that tells nothing certain, a live read of the
// VolumeAttachment (Fate). The executor makes the call, the write and the
// read; these functions decide what they mean, in three steps:
//
//	rec := AfterPublish(answer)        // what to write: attached, or which attachError
//	fate, read := VAFate(facts)        // read: make a live read, then ask again
//	out := PublishOutcome(answer, fate, writeFailed)

// Published is a ControllerPublish's answer as the executor classified it
// (internal/csi owns which gRPC codes are final, the executor which are
// the backend pushing back).
type Published struct {
	// Err is the driver's error; nil: the volume is published.
	Err error
	// Final: Err is final (nothing was published). Otherwise the call may
	// still be in progress and the volume may be published.
	Final bool
	// Throttled: Err is the backend pushing back (ResourceExhausted,
	// Unavailable); a Throttled answer is never Final.
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
