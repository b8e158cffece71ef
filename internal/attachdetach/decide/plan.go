package decide

import (
	"fmt"
	"time"

	storagev1 "k8s.io/api/storage/v1"

	"github.com/latchcsi/latch/internal/attachdetach/state"
)

// Kind says what a Plan asks the executor to do.
type Kind int

const (
	// KindNothing: the key is settled.
	KindNothing Kind = iota
	// KindWait: something has to happen first (an unmount, the attacher,
	// our own VolumeAttachment's deletion). An event on the watched objects wakes the key;
	// RequeueAfter > 0 adds a timer (the unmount timeout).
	KindWait
	// KindCreate: create Plan.Create. Any failure, AlreadyExists
	// included, leaves the outcome unknown: the executor asks the API
	// server, and until it answers the next Input has VA.MayExist.
	KindCreate
	// KindMarkAttached: the VolumeAttachment is attached; Plan.Actual
	// records it and puts the volume into the node's volumesAttached.
	KindMarkAttached
	// KindAttachError: the VolumeAttachment reports an attach error;
	// emit Plan.Events. csi-attacher retries on its own.
	KindAttachError
	// KindConflict: the volume is exclusive and attached to, attaching
	// to, or being detached from another node; emit Plan.Events (the
	// Multi-Attach error, each once per Pod, see Event.DedupeKey) and
	// wait.
	KindConflict
	// KindDetach: delete the VolumeAttachment Detach.Name. NotFound
	// counts as success. Decide returns it only once the node's
	// status.volumesAttached cannot list the volume any more (see
	// KindWaitForNodeStatus).
	KindDetach
	// KindForget: the VolumeAttachment is gone; Plan.Actual removes the
	// entry (and with it the node status line, written asynchronously).
	KindForget
	// KindNodeNotMigrated: the volume was translated from an in-tree
	// plugin in Config.MigrationByNode and the node's CSINode does not
	// list that plugin as migrated; emit Plan.Events (each once) and wait.
	// A change of the node's CSINode wakes the key.
	KindNodeNotMigrated
	// KindWaitForNodeStatus: the volume is to be detached, but the
	// kubelet may still see it attached: the actual state reports it in
	// the node's status.volumesAttached, or the node's status may still
	// list it (Input.NodeStatusMayList). Plan.Actual stops reporting it;
	// nothing is deleted and no event is emitted; WakeNodeStatus is set,
	// and the node status updater wakes the key once the list is written
	// without the volume.
	KindWaitForNodeStatus
)

var kindNames = [...]string{"Nothing", "Wait", "Create", "MarkAttached", "AttachError", "Conflict", "Detach", "Forget", "NodeNotMigrated", "WaitForNodeStatus"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// DetachReason says why a detach happens; the forced ones are the label
// values of upstream's attachdetach_controller_forced_detaches metric.
type DetachReason string

const (
	// DetachUnmounted: nothing wants the volume and the node does not use
	// it.
	DetachUnmounted DetachReason = "unmounted"
	// DetachForcedTimeout: the node is not Ready and still lists the
	// volume in volumesInUse after MaxWaitForUnmount.
	DetachForcedTimeout DetachReason = "timeout"
	// DetachOutOfService: the node has the out-of-service taint.
	DetachOutOfService DetachReason = "out-of-service"
)

// Forced reports whether the detach skips the wait for the unmount.
func (r DetachReason) Forced() bool { return r == DetachForcedTimeout || r == DetachOutOfService }

// Detach describes a VolumeAttachment deletion.
type Detach struct {
	// Name of the VolumeAttachment to delete.
	Name   string
	Reason DetachReason
}

// Event is a Kubernetes event to record on a pod.
type Event struct {
	Pod     state.PodRef
	Type    string // v1.EventTypeNormal or v1.EventTypeWarning
	Reason  string
	Message string
	// DedupeKey identifies the event among the pod's events: emit it only
	// if state.Desired.MarkReported(pod UID, DedupeKey) returns true, so a
	// condition that lasts is reported once, not on every pass.
	DedupeKey string
}

// Plan is the result of Decide for one key. The executor applies it in
// this order: Actual (in memory, cannot fail), then the API action of the
// Kind, then Events; for KindCreate the create goes first and Actual is
// applied once it answered, whatever the answer (no other decision of the
// volume comes in between: the executor runs the keys of one volume one
// at a time). Then it wakes what Wakes says: the volume's other keys when
// Actual changed the ASW (their decisions depend on this one), the node
// status updater when the node's list changes.
type Plan struct {
	Kind Kind
	Key  state.Key
	// Why is a short constant explanation for logs and latchctl.
	Why string
	// Actual is the ASW update for the key; nil when nothing changes.
	Actual *state.Update
	// Create is the VolumeAttachment to create (KindCreate).
	Create *storagev1.VolumeAttachment
	// Detach is the VolumeAttachment to delete (KindDetach).
	Detach *Detach
	Events []Event
	// RequeueAfter > 0 asks to run the key again after this long even if
	// nothing changes (the unmount timeout expiring).
	RequeueAfter time.Duration
	// AttachWaiting: the plan waits for the attacher to attach the key's
	// VolumeAttachment (no attach error); AttachTimeouts is how many of
	// kube-controller-manager's attach attempts have timed out in that
	// wait (see AttachTimeouts). The executor keeps AttachWaitSince while
	// a wait lasts and drops it otherwise.
	AttachWaiting  bool
	AttachTimeouts int
	// WakeNodeStatus asks the executor to wake the node status updater
	// of Key.Node even if Actual changes nothing (KindWaitForNodeStatus).
	WakeNodeStatus bool
}

// Wakes is what the executor wakes once it has run a plan.
type Wakes struct {
	// Volume: the other keys of the plan's volume; the other nodes of the
	// volume decide on this one (multi-attach).
	Volume bool
	// NodeStatus: the node status updater of the plan's node.
	NodeStatus bool
}

// Wakes says what to wake after the plan ran; before is the actual state
// entry the decision saw (nil: none) and applied reports whether applying
// Actual changed it. A change wakes the volume's other keys, and the node
// status when it adds the volume to the node's status.volumesAttached or
// takes it off (ReportedInNodeStatus, or a reported entry removed);
// WakeNodeStatus wakes the node status alone.
func (p Plan) Wakes(before *state.Attachment, applied bool) Wakes {
	return Wakes{Volume: applied, NodeStatus: p.WakeNodeStatus || applied && p.changesReport(before)}
}

// changesReport reports whether applying Actual over before changes
// whether the volume belongs in the node's status.volumesAttached.
func (p Plan) changesReport(before *state.Attachment) bool {
	if p.Actual == nil {
		return false
	}
	was := before != nil && before.ReportedInNodeStatus
	return was != (!p.Actual.Remove && p.Actual.ReportedInNodeStatus)
}
