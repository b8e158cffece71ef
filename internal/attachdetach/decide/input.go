// Package decide is the attach/detach controller's reconcile decision: for
// one (volume, node) key, a pure function from what is observed (desired
// and actual state of the volume on every node, the Node, the
// VolumeAttachment, configuration, the current time) to a Plan that an
// executor carries out. It has no clients, no clock and no side effects,
// so every rule is table-tested and fuzzed.
package decide

import (
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/latchcsi/latch/internal/attachdetach/state"
	"github.com/latchcsi/latch/internal/attachdetach/volume"
	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// Config holds the knobs of the detach rules.
type Config struct {
	// MaxWaitForUnmount is how long a volume that is no longer wanted but
	// still mounted on a NotReady node waits before it is detached anyway
	// (kube-controller-manager's ReconcilerMaxWaitForUnmountDuration).
	MaxWaitForUnmount time.Duration
	// DisableForceDetachOnTimeout keeps waiting for the unmount forever
	// (--disable-force-detach-on-timeout); the out-of-service taint still
	// detaches.
	DisableForceDetachOnTimeout bool
	// MigrationByNode holds the in-tree plugins (csi-translation-lib
	// names, e.g. kubernetes.io/gce-pd) whose migration is not complete
	// (--csi-migration-by-node): their volumes are attached through CSI
	// only on nodes whose CSINode lists the plugin in its migrated-plugins
	// annotation. Empty means every migration is complete, which is
	// kube-controller-manager 1.36's behaviour.
	MigrationByNode map[string]bool
}

// DefaultMaxWaitForUnmount is upstream's default.
const DefaultMaxWaitForUnmount = 6 * time.Minute

// DefaultConfig returns upstream's defaults.
func DefaultConfig() Config {
	return Config{MaxWaitForUnmount: DefaultMaxWaitForUnmount}
}

// NodeFacts is what the decision needs to know about the Node object.
type NodeFacts struct {
	// Exists is false once the Node object is deleted.
	Exists bool
	// Managed: the node has the controller-managed-attach-detach
	// annotation. Only managed nodes get new attachments.
	Managed bool
	// Ready: the Ready condition is True. A node that is not Ready may be
	// force-detached after MaxWaitForUnmount.
	Ready bool
	// OutOfService: the node has the node.kubernetes.io/out-of-service
	// taint; its volumes are detached without waiting for the unmount.
	OutOfService bool
	// PodsPending: the node came back (its Node object re-created, or
	// managed again) and some of its Pods are not yet recorded again in
	// the desired state. A volume they use looks unwanted meanwhile, and
	// a re-registered Node's empty volumesInUse makes it look unmounted:
	// nothing on the node is detached until they are. Not from the Node
	// object: the controller's own bookkeeping sets it.
	PodsPending bool
}

// NodeFactsOf extracts NodeFacts from a node; nil means deleted.
//
// The out-of-service taint matches on its key with any effect, as
// upstream's reconciler does (taints.TaintKeyExists); the documented
// usage is the NoExecute effect, and NoSchedule is accepted too.
func NodeFactsOf(node *v1.Node) NodeFacts {
	if node == nil {
		return NodeFacts{}
	}
	_, managed := node.Annotations[kubenames.ControllerManagedAttachAnnotation]
	f := NodeFacts{Exists: true, Managed: managed}
	for _, c := range node.Status.Conditions {
		if c.Type == v1.NodeReady {
			f.Ready = c.Status == v1.ConditionTrue
		}
	}
	f.OutOfService = slices.ContainsFunc(node.Spec.Taints, func(t v1.Taint) bool {
		return t.Key == kubenames.OutOfServiceTaintKey
	})
	return f
}

// VAFacts is what the decision needs to know about the VolumeAttachment
// of the key (named volume.AttachmentNameFor(key)).
type VAFacts struct {
	Exists   bool
	Attached bool
	// Deleting: metadata.deletionTimestamp is set (csi-attacher detaches).
	Deleting    bool
	AttachError *storagev1.VolumeError
	DetachError *storagev1.VolumeError
	// MayExist: the informer does not show the VolumeAttachment, but a
	// create of it ended without a clear answer (an error, a timeout, or
	// AlreadyExists) and the API server has not yet told whether it
	// exists. Only meaningful when Exists is false.
	MayExist bool
}

// VAFactsOf extracts VAFacts from a VolumeAttachment; nil means absent.
func VAFactsOf(va *storagev1.VolumeAttachment) VAFacts {
	if va == nil {
		return VAFacts{}
	}
	return VAFacts{
		Exists:      true,
		Attached:    va.Status.Attached,
		Deleting:    va.DeletionTimestamp != nil,
		AttachError: va.Status.AttachError,
		DetachError: va.Status.DetachError,
	}
}

// Peer is the volume on another node.
type Peer struct {
	Node string
	// State is the ASW state there; 0 when the ASW has no entry.
	State state.AttachState
	// Pods want the volume there (DSW), sorted.
	Pods []state.PodRef
	// Specs are the specs that name the volume there: those the Pods
	// resolved it to (state.Wanted.Specs) and the one recorded with the
	// ASW entry. Multi-attach looks at every one of them.
	Specs []volume.Attachable
}

// Input is everything Decide looks at for one key.
type Input struct {
	Key state.Key
	// Wanted is the DSW entry for the key; nil when no pod wants the
	// volume on this node.
	Wanted *state.Wanted
	// Actual is the ASW entry for the key; nil when there is none.
	Actual *state.Attachment
	// Peers is the volume on every other node that has an ASW entry or a
	// pod wanting it, sorted by node.
	Peers []Peer
	Node  NodeFacts
	// CSINode matters only for volumes of a plugin in
	// Config.MigrationByNode.
	CSINode CSINodeFacts
	VA      VAFacts
	// Listing is what the Node's status says about the volume; nil when
	// the Node does not exist or was not read. Only the correction of an
	// assumed mount looks at it (see correctAssumedMount).
	Listing *NodeListing
	// NodeStatusMayList: the Node's status.volumesAttached on the API
	// server may still list the volume: the controller's last successful
	// write of it lists the volume, or a write in flight does, or, before
	// the first write of this process, the informer's Node does. False
	// once the Node is known gone. state.Actual.NodeStatusMayList gives
	// it; together with the entry's ReportedInNodeStatus it holds a detach
	// back until the kubelet can no longer see the volume as attached.
	NodeStatusMayList bool
	Config            Config
	Now               time.Time
	// AttachWaitSince is when the wait for the attacher to attach the
	// key's VolumeAttachment started (the create, the first pass that saw
	// it unattached, or the last attach error); zero: it starts now. The
	// attach timeouts are counted from it (see AttachTimeouts).
	AttachWaitSince time.Time
}
