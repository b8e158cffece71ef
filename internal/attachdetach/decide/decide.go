package decide

import (
	"slices"
	"time"

	"github.com/latchcsi/latch/internal/attachdetach/state"
	"github.com/latchcsi/latch/internal/attachdetach/volume"
)

// Decide returns what to do for one (volume, node) key. It is level-based:
// running it again on the same input gives the same plan, and once the
// executor applied a plan, the next pass sees the result (or the lack of
// it) and continues from there. Decide never mutates its input.
//
// The rules, in upstream's terms:
//   - Wanted (a pod on an existing node wants the volume): confirm an
//     attached VolumeAttachment, wait for a deleting one to go, refuse a
//     second node for an exclusive volume (see Exclusive: any spec that
//     names the unique volume counts), wait while our last create's
//     outcome is unknown (VAFacts.MayExist), report attach errors, wait while
//     the node has not migrated the volume's in-tree plugin (only for
//     plugins in Config.MigrationByNode), or create the VolumeAttachment.
//   - Not wanted: keep the entry while our last create's outcome is
//     unknown (the VolumeAttachment may exist and get published); detach
//     once the node no longer lists the volume in
//     volumesInUse; detach anyway when the node has the out-of-service
//     taint, or is not Ready and MaxWaitForUnmount has passed since the
//     detach was first wanted (unless force detach is disabled). The
//     volume leaves the node's volumesAttached before the VolumeAttachment
//     is deleted: while the actual state reports it there, or the node's
//     status may still list it (Input.NodeStatusMayList), the detach
//     waits for the node status (KindWaitForNodeStatus).
//   - An entry assumed mounted that the kubelet cannot have mounted (see
//     correctAssumedMount) counts as unmounted.
func Decide(in Input) Plan {
	in = correctAssumedMount(in)
	if in.Wanted != nil && len(in.Wanted.Pods) > 0 && in.Node.Exists {
		return decideWanted(in)
	}
	return decideUnwanted(in)
}

// entry is the ASW entry as a decision would write it: the current one,
// or a fresh one for a key the ASW does not know yet.
func entry(in Input, fresh state.AttachState) state.Update {
	if in.Actual == nil {
		return state.Update{State: fresh}
	}
	return state.Update{
		State:                in.Actual.State,
		ReportedInNodeStatus: in.Actual.ReportedInNodeStatus,
		DetachRequestedAt:    in.Actual.DetachRequestedAt,
	}
}

// changed returns &u when applying u would change the ASW entry.
func changed(in Input, u state.Update) *state.Update {
	cur := in.Actual
	if u.Remove {
		if cur == nil {
			return nil
		}
		return &u
	}
	if cur != nil && !specChanges(cur.Spec, u.Spec) && cur.State == u.State &&
		cur.ReportedInNodeStatus == u.ReportedInNodeStatus && cur.DetachRequestedAt.Equal(u.DetachRequestedAt) {
		return nil
	}
	return &u
}

// specChanges reports whether recording spec next over cur changes what
// the actual state knows of the volume: a first spec, or one that makes
// the attachment exclusive (or shareable).
func specChanges(cur, next *volume.Attachable) bool {
	return next != nil && (cur == nil || cur.MultiAttachAllowed() != next.MultiAttachAllowed())
}

// changedIfRecorded is changed for a key the actual state has an entry
// of; for a node the volume never reached there is nothing to record.
func changedIfRecorded(in Input, u state.Update) *state.Update {
	if in.Actual == nil {
		return nil
	}
	return changed(in, u)
}

func decideWanted(in Input) Plan {
	p := Plan{Key: in.Key}
	spec := in.Wanted.Volume
	u := entry(in, state.StateAttaching)
	// Wanted again: the unmount timer of an earlier detach request stops.
	u.DetachRequestedAt = time.Time{}
	// The spec is recorded once, except that a spec that makes the
	// attachment exclusive replaces a shareable one: a Pod's volumes may
	// resolve one after another (a claim bound later), and an attachment
	// one of its Pods ever named through a single-node PV stays
	// exclusive until it is detached, even after that Pod is gone.
	if in.Actual == nil || in.Actual.Spec == nil || in.Actual.Spec.MultiAttachAllowed() && !spec.MultiAttachAllowed() {
		u.Spec = &spec
	}

	switch {
	case in.VA.Exists && in.VA.Deleting:
		// Cannot attach through an attachment that csi-attacher is
		// tearing down; its deletion event brings us back.
		u.State, u.ReportedInNodeStatus = state.StateDetaching, false
		p.Kind, p.Why = KindWait, "VolumeAttachment is being deleted, attach after it is gone"
		p.Actual = changed(in, u)
		return p

	case in.VA.Exists && in.VA.Attached:
		wasAttached := in.Actual != nil && in.Actual.State == state.StateAttached
		u.State, u.ReportedInNodeStatus = state.StateAttached, true
		if p.Actual = changed(in, u); p.Actual == nil {
			p.Kind, p.Why = KindNothing, "attached"
			return p
		}
		p.Kind, p.Why = KindMarkAttached, "VolumeAttachment is attached"
		if !wasAttached {
			p.Events = attachedEvents(in)
		}
		return p
	}

	// Not attached here (yet). An exclusive volume must not get a second
	// node while it is, or may be, attached to another one.
	// Being detached there counts: until csi-attacher has let the
	// VolumeAttachment go, the volume is still attached (and the detach
	// may keep failing). kube-controller-manager keeps such a volume in
	// its actual state until the detach succeeded, and reports the
	// Multi-Attach error on the waiting Pods the same way.
	if Exclusive(in) {
		if holders, detachingOnly := holdingPeers(in.Peers); len(holders) > 0 {
			var others []state.PodRef
			for _, h := range holders {
				others = append(others, h.Pods...)
			}
			p.Kind, p.Why = KindConflict, "volume is exclusively attached to another node"
			if detachingOnly {
				p.Why = "waiting for the volume to be detached from another node"
			}
			p.Events = conflictEvents(in, others)
			p.Actual = changedIfRecorded(in, u)
			return p
		}
	}

	if !in.VA.Exists && in.VA.MayExist {
		// Our create ended without a clear answer: creating again would
		// not tell more, and the executor asks the API server.
		if in.Actual == nil {
			u.State = state.StateUncertain
		}
		u.ReportedInNodeStatus = false
		p.Kind, p.Why = KindWait, "the outcome of the VolumeAttachment create is unknown"
		p.Actual = changed(in, u)
		return p
	}

	if in.VA.Exists {
		// Ours or one found at start: the attacher is working on it.
		if in.Actual == nil || in.Actual.State == state.StateUncertain {
			u.State = state.StateUncertain
		} else {
			u.State = state.StateAttaching
		}
		u.ReportedInNodeStatus = false
		p.Actual = changed(in, u)
		if in.VA.AttachError != nil {
			p.Kind, p.Why = KindAttachError, "VolumeAttachment reports an attach error"
			p.Events = attachErrorEvents(in)
			return p
		}
		p.Kind, p.Why = KindWait, "waiting for the attacher to attach the VolumeAttachment"
		p.AttachWaiting = true
		attachTimeoutPlan(in, &p)
		return p
	}

	if !in.Node.Managed {
		p.Kind, p.Why = KindNothing, "node is not controller-managed"
		return p
	}
	if plugin, blocked := needsNodeMigration(in); blocked {
		// Only a new attachment waits: an existing VolumeAttachment was
		// handled above and is kept (kube-controller-manager does not
		// detach a volume because its node stops being migrated either).
		p.Kind, p.Why = KindNodeNotMigrated, "node has not migrated the volume's in-tree plugin to CSI"
		p.Events = notMigratedEvents(in, plugin)
		p.Actual = changedIfRecorded(in, u)
		return p
	}
	// Record "attaching" with the create, whatever its answer, so that
	// the next decision for another node of an exclusive volume sees it.
	u.State, u.ReportedInNodeStatus = state.StateAttaching, false
	p.Kind, p.Why = KindCreate, "volume is wanted and has no VolumeAttachment"
	p.Create = spec.VolumeAttachment(in.Key.Node)
	p.Actual = changed(in, u)
	return p
}

// Exclusive reports whether the key's unique volume must not be attached
// to more than one node. It is exclusive when any spec that names it is:
// the one wanted here and every other the Pods here resolved it to, the
// one recorded with the attachment here, and those of every other node
// (wanted there or recorded with an attachment there). Two PVs (or a PV
// and an inline spec) can carry the same driver and volume handle, and
// one of them being ReadWriteMany does not make the volume safe to share
// while another names it ReadWriteOnce. kube-controller-manager looks only
// at the spec being attached; this is deliberately stricter.
func Exclusive(in Input) bool {
	excl := func(a *volume.Attachable) bool { return !a.MultiAttachAllowed() }
	if in.Wanted != nil {
		if excl(&in.Wanted.Volume) || slices.ContainsFunc(in.Wanted.Specs, func(a volume.Attachable) bool { return excl(&a) }) {
			return true
		}
	}
	if in.Actual != nil && in.Actual.Spec != nil && excl(in.Actual.Spec) {
		return true
	}
	for _, pr := range in.Peers {
		if slices.ContainsFunc(pr.Specs, func(a volume.Attachable) bool { return excl(&a) }) {
			return true
		}
	}
	return false
}

// holdingPeers returns the peers that hold an exclusive volume (attached,
// attaching, uncertain or being detached there), and whether every one of
// them is being detached.
func holdingPeers(peers []Peer) (holders []Peer, detachingOnly bool) {
	detachingOnly = true
	for _, pr := range peers {
		switch pr.State {
		case state.StateAttached, state.StateAttaching, state.StateUncertain:
			detachingOnly = false
		case state.StateDetaching:
		default:
			continue
		}
		holders = append(holders, pr)
	}
	return holders, detachingOnly
}

func decideUnwanted(in Input) Plan {
	p := Plan{Key: in.Key}
	if in.Actual == nil && !in.VA.Exists && !in.VA.MayExist {
		p.Kind, p.Why = KindNothing, "not wanted, not attached"
		return p
	}
	fresh := state.StateUncertain
	if in.VA.Attached {
		fresh = state.StateAttached
	}
	u := entry(in, fresh)

	if in.VA.Exists && in.VA.Deleting {
		u.State, u.ReportedInNodeStatus = state.StateDetaching, false
		p.Kind, p.Why = KindWait, "VolumeAttachment is being deleted"
		p.Actual = changed(in, u)
		return p
	}
	if !in.VA.Exists && in.VA.MayExist {
		// The informer shows nothing, but our create may have made it:
		// forgetting the entry would let an exclusive volume attach
		// elsewhere while this one gets published. The entry stays (and
		// blocks) until the API server says whether the object exists.
		p.Kind, p.Why = KindWait, "the outcome of the VolumeAttachment create is unknown"
		p.Actual = changed(in, u)
		return p
	}
	if !in.VA.Exists && in.Actual.State != state.StateAttached {
		// Detached (we deleted it), never created (the informer will show
		// it if it was), or deleted by someone else: nothing is attached.
		p.Kind, p.Why = KindForget, "VolumeAttachment is gone"
		p.Actual = changed(in, state.Update{Remove: true})
		return p
	}

	if in.Node.Exists && in.Node.PodsPending {
		// The node came back and its Pods are being recorded again: one
		// of them may still use the volume. Their passes wake the key.
		p.Kind, p.Why = KindWait, "node came back; its Pods are not all recorded again yet"
		p.Actual = changed(in, u)
		return p
	}
	if u.DetachRequestedAt.IsZero() {
		u.DetachRequestedAt = in.Now
	}
	// A key the ASW does not know yet is assumed mounted, like a new ASW
	// entry; recording it brings the node's volumesInUse into play.
	mounted := in.Actual == nil || in.Actual.MountedByNode
	healthy := in.Node.Exists && in.Node.Ready
	outOfService := in.Node.Exists && in.Node.OutOfService
	deadline := u.DetachRequestedAt.Add(in.Config.MaxWaitForUnmount)
	canForce := !healthy && !in.Config.DisableForceDetachOnTimeout
	forced := canForce && !in.Now.Before(deadline)

	var reason DetachReason
	switch {
	case !mounted:
		reason = DetachUnmounted
	case forced:
		reason = DetachForcedTimeout
	case outOfService:
		reason = DetachOutOfService
	default:
		p.Kind, p.Why = KindWait, "volume is still in the node's volumesInUse"
		p.Actual = changed(in, u)
		if canForce {
			p.RequeueAfter = deadline.Sub(in.Now)
		}
		return p
	}

	if !in.VA.Exists {
		// Known attached (from Node.status) but without VolumeAttachment:
		// nothing to delete once the mount rule allows the detach.
		p.Kind, p.Why = KindForget, "detached: VolumeAttachment is already gone"
		p.Actual = changed(in, state.Update{Remove: true})
		return p
	}
	name, err := volume.AttachmentNameFor(in.Key.Volume, in.Key.Node)
	if err != nil {
		// Keys come from CSI unique names; this is a caller bug.
		p.Kind, p.Why = KindNothing, "cannot derive the VolumeAttachment name: "+err.Error()
		return p
	}
	u.State, u.ReportedInNodeStatus = state.StateDetaching, false
	p.Actual = changed(in, u)
	if in.Actual != nil && in.Actual.ReportedInNodeStatus || in.NodeStatusMayList {
		// The kubelet may still see the volume as attached: it leaves
		// the node's volumesAttached first (Actual stops reporting it;
		// the node status updater writes the list and wakes the key).
		p.Kind, p.Why = KindWaitForNodeStatus, "waiting for the node status to drop the volume before detaching"
		p.WakeNodeStatus = true
		return p
	}
	p.Kind, p.Why = KindDetach, "volume is no longer wanted on the node"
	p.Detach = &Detach{Name: name, Reason: reason}
	return p
}
