package decide

import (
	"fmt"
)

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
	// ReasonWaitingForSecret: the controller-publish Secret does not exist
	// (yet).
	ReasonWaitingForSecret Reason = "WaitingForSecret"
	// ReasonSecretForbidden: csi-attacher's ServiceAccount may not get the
	// Secret. The deploy defaults grant no Secret access at all; a driver
	// whose volumes name a controller-publish secret needs a Role with
	// get on secrets in that namespace.
	ReasonSecretForbidden Reason = "SecretForbidden"
	// ReasonUnpublishUnsupported: a VA being deleted carries our finalizer
	// (attached while the driver had PUBLISH_UNPUBLISH_VOLUME) but the
	// driver no longer has that capability (trivial mode): nothing can
	// unpublish it, and only an edit of the VA (the finalizer removed by
	// hand) ends the detach.
	ReasonUnpublishUnsupported Reason = "UnpublishUnsupported"
	// ReasonOrphanOnOtherNode: the volume may be on one node only and a
	// publication of it to another node ID, whose VolumeAttachment is
	// gone, is still to be undone (PublishBlockedByOrphan). Retried with
	// backoff, and at once when that publication is undone.
	ReasonOrphanOnOtherNode Reason = "OrphanedPublicationOnOtherNode"
)

// Class says how a recorded failure is retried.
type Class int

const (
	// ClassRetry: retried with the runner's exponential backoff. The
	// WaitingForPV and WaitingForCSINode reasons are also woken at once
	// when the object they wait for appears (those objects are watched).
	ClassRetry Class = iota
	// ClassTerminal: only an edit of the VolumeAttachment can change the
	// outcome; not retried until the VolumeAttachment changes.
	ClassTerminal
	// ClassWaitForObject: waiting for an object latch does not watch
	// (Secrets: watching them would need list/watch on every Secret in
	// the cluster); polled every Config.SecretRetryInterval, no backoff.
	ClassWaitForObject
)

var classNames = [...]string{"Retry", "Terminal", "WaitForObject"}

func (c Class) String() string {
	if int(c) >= 0 && int(c) < len(classNames) {
		return classNames[c]
	}
	return fmt.Sprintf("Class(%d)", int(c))
}

// Class returns how a failure with this reason is retried. A driver error
// (no Reason) is ClassRetry.
func (r Reason) Class() Class {
	switch r {
	case ReasonInvalidSource, ReasonPublishContextTooLarge, ReasonUnpublishUnsupported:
		return ClassTerminal
	case ReasonWaitingForSecret, ReasonSecretForbidden:
		return ClassWaitForObject
	}
	return ClassRetry
}

// MaxAttachmentMetadataBytes is the API server's limit on
// VolumeAttachment status.attachmentMetadata: the sum of the lengths of
// its keys and values (k8s.io/kubernetes/pkg/apis/storage/validation,
// maxAttachedVolumeMetadataSize).
const MaxAttachmentMetadataBytes = 256 * 1024

// Blocked says why nothing can be done yet; Message goes into the
// VolumeAttachment's attachError/detachError as is.
type Blocked struct {
	Reason  Reason
	Message string
}

func (b *Blocked) Error() string { return b.Message }
