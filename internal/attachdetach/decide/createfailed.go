package decide

import (
	v1 "k8s.io/api/core/v1"

	"github.com/latchcsi/latch/internal/attachdetach/state"
)

// CreateFailedPrefix starts kube-controller-manager's error for a
// VolumeAttachment create the API server refused: its CSI attacher's
// "attacher.Attach failed: <API error>" (pkg/volume/csi/csi_attacher.go),
// prefixed with the plugin name. latchctl recognises a refused create in
// a Pod's FailedAttachVolume event by it.
const CreateFailedPrefix = "kubernetes.io/csi: attacher.Attach failed: "

// CreateFailedEvents are the events for a create of the VolumeAttachment
// of key that failed with createErr (an admission policy or webhook
// refused it, a quota, RBAC, a timeout): Warning FailedAttachVolume on
// each Pod in w, with kube-controller-manager's text, "AttachVolume.Attach
// failed for volume "<spec>" : kubernetes.io/csi: attacher.Attach failed:
// <API error>".
//
// As kube-controller-manager does, every failed create is reported: the
// executor emits these events for each attempt (DedupeKey is empty), so
// they are as frequent as the create's retries, whose per-key backoff
// bounds them, and an event recorder folds the repeats of one text into
// one Event whose count grows. A condition that lasts stays visible
// beyond the events' time to live.
func CreateFailedEvents(key state.Key, w state.Wanted, createErr string) []Event {
	msg := AttachFailedMessage(w.Volume.SpecName, CreateFailedPrefix+createErr)
	return podEvents(Input{Key: key, Wanted: &w}, v1.EventTypeWarning, ReasonFailedAttachVolume, "", func(state.PodRef) string { return msg })
}
