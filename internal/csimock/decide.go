package csimock

import (
	"fmt"
	"sort"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// This file holds the pure decisions of the controller service: given what
// the store holds about one volume and one node, what must happen. They
// take no locks and do no I/O, so every code path is table-testable, and the
// store only applies the verdict.

// isSingleNode reports whether an access mode allows the volume on only one
// node at a time (the spec's "non MULTI_NODE" modes).
func isSingleNode(mode csi.VolumeCapability_AccessMode_Mode) bool {
	switch mode {
	case csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER:
		return true
	}
	return false
}

// validateCapability checks one volume capability the way a driver must
// before acting on it: a known access mode and exactly one access type.
// The SINGLE_NODE_{SINGLE,MULTI}_WRITER modes exist only for drivers that
// advertise SINGLE_NODE_MULTI_WRITER; a CO must not send them otherwise.
func validateCapability(c *csi.VolumeCapability, caps Capabilities) error {
	if c == nil {
		return status.Error(codes.InvalidArgument, "volume capability is required")
	}
	if c.GetBlock() == nil && c.GetMount() == nil {
		return status.Error(codes.InvalidArgument, "volume capability must have an access type (block or mount)")
	}
	mode := c.GetAccessMode().GetMode()
	switch mode {
	case csi.VolumeCapability_AccessMode_UNKNOWN:
		return status.Error(codes.InvalidArgument, "volume capability access mode is required")
	case csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER:
		if !caps.SingleNodeMultiWriter {
			return status.Errorf(codes.InvalidArgument, "access mode %s needs the SINGLE_NODE_MULTI_WRITER capability, which this driver does not advertise", mode)
		}
	}
	if _, ok := csi.VolumeCapability_AccessMode_Mode_name[int32(mode)]; !ok {
		return status.Errorf(codes.InvalidArgument, "unknown access mode %d", mode)
	}
	return nil
}

// publishArgs are the fields of ControllerPublishVolume the decision needs.
type publishArgs struct {
	VolumeID   string
	NodeID     string
	Readonly   bool
	Capability *csi.VolumeCapability
}

func validatePublish(a publishArgs, caps Capabilities) error {
	if a.VolumeID == "" {
		return status.Error(codes.InvalidArgument, "volume ID is required")
	}
	if a.NodeID == "" {
		return status.Error(codes.InvalidArgument, "node ID is required")
	}
	if err := validateCapability(a.Capability, caps); err != nil {
		return err
	}
	if a.Readonly && !caps.PublishReadonly {
		// The spec: "CO MUST set this field to false if SP does not have the
		// PUBLISH_READONLY controller capability."
		return status.Error(codes.InvalidArgument, "readonly publish requested but the PUBLISH_READONLY capability is not advertised")
	}
	return nil
}

// publishView is what the store knows that matters for one publish.
type publishView struct {
	VolumeExists bool
	AutoCreate   bool
	NodeKnown    bool
	// Existing is the publication of this volume on the requested node.
	Existing *publication
	// Others are the publications of this volume on other nodes.
	Others []*publication
	// NodeCount is the number of volumes published to the requested node.
	NodeCount           int64
	MaxVolumesPerNode   int64
	SkipSingleNodeCheck bool
}

type publishVerdict int

const (
	// publishNew: record a new publication.
	publishNew publishVerdict = iota
	// publishAgain: already published compatibly; reply with the stored
	// publish context.
	publishAgain
	// publishReject: return the error.
	publishReject
)

// decidePublish returns what ControllerPublishVolume must do, in the order
// a careful driver checks: existence of volume and node, idempotent repeat,
// incompatible repeat, exclusivity, attach limit. A new publication that
// breaks single-node exclusivity only happens with SkipSingleNodeCheck;
// the caller records it as a violation.
func decidePublish(a publishArgs, v publishView) (publishVerdict, error) {
	if !v.VolumeExists && !v.AutoCreate {
		return publishReject, status.Errorf(codes.NotFound, "volume %q does not exist", a.VolumeID)
	}
	if !v.NodeKnown {
		return publishReject, status.Errorf(codes.NotFound, "node %q does not exist", a.NodeID)
	}
	if e := v.Existing; e != nil {
		if e.Readonly != a.Readonly {
			return publishReject, status.Errorf(codes.AlreadyExists, "volume %q is already published to node %q with readonly=%t", a.VolumeID, a.NodeID, e.Readonly)
		}
		if !proto.Equal(e.Capability, a.Capability) {
			return publishReject, status.Errorf(codes.AlreadyExists, "volume %q is already published to node %q with a different volume capability", a.VolumeID, a.NodeID)
		}
		return publishAgain, nil
	}
	if !v.SkipSingleNodeCheck {
		if conflict := singleNodeConflict(a.Capability.GetAccessMode().GetMode(), v.Others); len(conflict) > 0 {
			// The spec asks for the node the volume is published at in the message.
			return publishReject, status.Errorf(codes.FailedPrecondition, "volume %q is already published to node(s) %s and the access mode is single-node", a.VolumeID, strings.Join(conflict, ","))
		}
	}
	if v.MaxVolumesPerNode > 0 && v.NodeCount >= v.MaxVolumesPerNode {
		return publishReject, status.Errorf(codes.ResourceExhausted, "node %q already has the maximum of %d volumes published", a.NodeID, v.MaxVolumesPerNode)
	}
	return publishNew, nil
}

// singleNodeConflict returns the other nodes that prevent publishing with
// mode: any other node if the new mode is single-node, or the other node
// holding a single-node publication (a volume published single-node is
// exclusive whatever the newcomer asks for). Sorted for stable messages.
func singleNodeConflict(mode csi.VolumeCapability_AccessMode_Mode, others []*publication) []string {
	var out []string
	for _, o := range others {
		if isSingleNode(mode) || isSingleNode(o.Capability.GetAccessMode().GetMode()) {
			out = append(out, o.NodeID)
		}
	}
	sort.Strings(out)
	return out
}

// createArgs are the fields of CreateVolume the decision needs.
type createArgs struct {
	Name         string
	Required     int64
	Limit        int64
	Parameters   map[string]string
	Capabilities []*csi.VolumeCapability
}

func validateCreate(a createArgs, caps Capabilities) error {
	if a.Name == "" {
		return status.Error(codes.InvalidArgument, "volume name is required")
	}
	if len(a.Capabilities) == 0 {
		return status.Error(codes.InvalidArgument, "volume capabilities are required")
	}
	for _, c := range a.Capabilities {
		if err := validateCapability(c, caps); err != nil {
			return err
		}
	}
	if a.Required < 0 || a.Limit < 0 {
		return status.Error(codes.InvalidArgument, "capacity range must not be negative")
	}
	if a.Limit > 0 && a.Required > a.Limit {
		return status.Errorf(codes.InvalidArgument, "required bytes %d exceed limit bytes %d", a.Required, a.Limit)
	}
	return nil
}

// capacityFor is what a new volume gets: the required size, else the
// limit, else 0 (unknown), as a thin-provisioning backend would.
func capacityFor(a createArgs) int64 {
	if a.Required > 0 {
		return a.Required
	}
	return a.Limit
}

// createCompatible decides whether a repeated CreateVolume for an existing
// name is the same request (idempotent OK) or a conflicting one
// (AlreadyExists, as the spec demands).
func createCompatible(existing *volume, a createArgs) error {
	if a.Required > 0 && existing.CapacityBytes < a.Required ||
		a.Limit > 0 && existing.CapacityBytes > a.Limit {
		return status.Errorf(codes.AlreadyExists, "volume %q exists with capacity %d, incompatible with the requested range [%d, %d]", a.Name, existing.CapacityBytes, a.Required, a.Limit)
	}
	if !equalStringMaps(existing.Parameters, a.Parameters) {
		return status.Errorf(codes.AlreadyExists, "volume %q exists with different parameters", a.Name)
	}
	return nil
}

func equalStringMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if bv, ok := b[k]; !ok || bv != v {
			return false
		}
	}
	return true
}

// devicePath is the publish context value of the n-th publication. It is
// fixed for the life of the publication so a CO may cache it.
func devicePath(n uint64) string {
	return fmt.Sprintf("/dev/mock/%d", n)
}
