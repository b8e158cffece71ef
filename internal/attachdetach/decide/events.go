package decide

import (
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/latchcsi/latch/internal/attachdetach/state"
)

// Event reasons and texts, identical to kube-controller-manager v1.36
// (pkg/kubelet/events, reconciler.reportMultiAttachError and the
// operation generator), because users and alerts grep for them.
const (
	ReasonFailedAttachVolume     = "FailedAttachVolume"
	ReasonSuccessfulAttachVolume = "SuccessfulAttachVolume"
)

// volumeMsg mirrors upstream's generateVolumeMsg: "%v for volume %q %v".
// With an empty suffix it leaves a trailing space, as upstream does.
func volumeMsg(prefix, specName, suffix string) string {
	return fmt.Sprintf("%s for volume %q %s", prefix, specName, suffix)
}

// MultiAttachMessage is the FailedAttachVolume text for pod, whose volume
// specName is exclusively attached elsewhere; others are the pods that use
// the volume on the other nodes. Names of pods in other namespaces are not
// shown to pod's namespace, only counted.
func MultiAttachMessage(specName string, pod state.PodRef, others []state.PodRef) string {
	if len(others) == 0 {
		return volumeMsg("Multi-Attach error", specName, "Volume is already exclusively attached to one node and can't be attached to another")
	}
	var local []string
	foreign := 0
	for _, o := range others {
		if o.Namespace == pod.Namespace {
			local = append(local, o.Name)
		} else {
			foreign++
		}
	}
	var msg string
	if len(local) > 0 {
		msg = "Volume is already used by pod(s) " + strings.Join(local, ", ")
		if foreign > 0 {
			msg = fmt.Sprintf("%s and %d pod(s) in different namespaces", msg, foreign)
		}
	} else {
		msg = fmt.Sprintf("Volume is already used by %d pod(s) in different namespaces", foreign)
	}
	return volumeMsg("Multi-Attach error", specName, msg)
}

// AttachFailedMessage is the FailedAttachVolume text for a
// VolumeAttachment's status.attachError (upstream: GenerateError with
// errSuffix, hence the " : ").
func AttachFailedMessage(specName, attachError string) string {
	return volumeMsg("AttachVolume.Attach failed", specName, ": "+attachError)
}

// AttachSucceededMessage is the SuccessfulAttachVolume text, trailing
// space included.
func AttachSucceededMessage(specName string) string {
	return volumeMsg("AttachVolume.Attach succeeded", specName, "")
}

// podEvents returns one event per Pod that wants the key's volume on the
// key's node, with message(pod) as its text.
func podEvents(in Input, eventType, reason, dedupeKey string, message func(state.PodRef) string) []Event {
	out := make([]Event, 0, len(in.Wanted.Pods))
	for _, p := range in.Wanted.Pods {
		out = append(out, Event{Pod: p, Type: eventType, Reason: reason, Message: message(p), DedupeKey: dedupeKey})
	}
	return out
}

func conflictEvents(in Input, others []state.PodRef) []Event {
	return podEvents(in, v1.EventTypeWarning, ReasonFailedAttachVolume, "multi-attach/"+in.Key.String(),
		func(p state.PodRef) string { return MultiAttachMessage(in.Wanted.Volume.SpecName, p, others) })
}

func attachErrorEvents(in Input) []Event {
	e := in.VA.AttachError
	// A new error (time or text) is a new event; a repeated pass over the
	// same error is not.
	key := fmt.Sprintf("attach-error/%s/%s/%s", in.Key, e.Time.UTC().Format("2006-01-02T15:04:05Z"), e.Message)
	msg := AttachFailedMessage(in.Wanted.Volume.SpecName, e.Message)
	return podEvents(in, v1.EventTypeWarning, ReasonFailedAttachVolume, key, func(state.PodRef) string { return msg })
}

func attachedEvents(in Input) []Event {
	msg := AttachSucceededMessage(in.Wanted.Volume.SpecName)
	return podEvents(in, v1.EventTypeNormal, ReasonSuccessfulAttachVolume, "attached/"+in.Key.String(), func(state.PodRef) string { return msg })
}
