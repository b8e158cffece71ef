package csimock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// The node service keeps, per node, the bookkeeping of staged and
// published paths, plus creating and removing the target path as the spec
// requires; nothing is mounted. The driver's own socket serves it for
// Config.NodeID (when Config.NodeService); StartNode serves it for any
// other node on a socket of its own (see nodeendpoint.go). Every node
// shares the controller's volume store, so NodeStageVolume can refuse a
// volume that is not ControllerPublished to that node.

type nodeStage struct {
	path       string
	capability *csi.VolumeCapability
}

type nodePublish struct {
	stagingPath string
	readonly    bool
	capability  *csi.VolumeCapability
}

// nodeState is one node's staged and published volumes.
type nodeState struct {
	id string
	mu sync.Mutex
	// staged is keyed by volume ID.
	staged map[string]nodeStage
	// published is keyed by volume ID, then target path.
	published map[string]map[string]nodePublish
}

func newNodeState(id string) *nodeState {
	return &nodeState{id: id, staged: map[string]nodeStage{}, published: map[string]map[string]nodePublish{}}
}

// nodeServer serves the Node service of one node.
type nodeServer struct {
	csi.UnimplementedNodeServer
	d    *Driver
	node *nodeState
}

var _ csi.NodeServer = (*nodeServer)(nil)

func (s *nodeServer) NodeGetInfo(ctx context.Context, _ *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{NodeId: s.node.id, MaxVolumesPerNode: s.d.state.maxVolumes(s.node.id, &s.d.cfg)}, nil
}

func (s *nodeServer) NodeGetCapabilities(ctx context.Context, _ *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	types := []csi.NodeServiceCapability_RPC_Type{csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME}
	if s.d.cfg.Capabilities.SingleNodeMultiWriter {
		types = append(types, csi.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER)
	}
	resp := &csi.NodeGetCapabilitiesResponse{}
	for _, t := range types {
		resp.Capabilities = append(resp.Capabilities, &csi.NodeServiceCapability{
			Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: t}},
		})
	}
	return resp, nil
}

// requireVolumeAndPath refuses a node request that lacks its volume ID
// or the path pathName names.
func requireVolumeAndPath(volID, pathName, path string) error {
	switch {
	case volID == "":
		return status.Error(codes.InvalidArgument, "volume ID is required")
	case path == "":
		return status.Errorf(codes.InvalidArgument, "%s is required", pathName)
	}
	return nil
}

// volumeMustExist is NotFound for a volume the driver does not have.
func (s *nodeServer) volumeMustExist(volID string) error {
	if !s.d.state.volumeExists(volID) {
		return status.Errorf(codes.NotFound, "volume %q does not exist", volID)
	}
	return nil
}

// checkAttached refuses node operations on a volume that is unknown, or
// that the controller has not published to this node: a kubelet that
// stages before the attach finished is a bug the mock should expose.
func (s *nodeServer) checkAttached(volumeID string) error {
	if err := s.volumeMustExist(volumeID); err != nil {
		return err
	}
	c := s.d.cfg.Capabilities
	if c.ControllerService && c.PublishUnpublishVolume && !s.d.state.isPublishedTo(volumeID, s.node.id) {
		return status.Errorf(codes.FailedPrecondition, "volume %q is not controller-published to node %q", volumeID, s.node.id)
	}
	return nil
}

func (s *nodeServer) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	if err := requireVolumeAndPath(req.GetVolumeId(), "staging target path", req.GetStagingTargetPath()); err != nil {
		return nil, err
	}
	if err := validateCapability(req.GetVolumeCapability(), s.d.cfg.Capabilities); err != nil {
		return nil, err
	}
	if err := s.checkAttached(req.GetVolumeId()); err != nil {
		return nil, err
	}
	n := s.node
	n.mu.Lock()
	defer n.mu.Unlock()
	if st, ok := n.staged[req.GetVolumeId()]; ok {
		if st.path != req.GetStagingTargetPath() || !proto.Equal(st.capability, req.GetVolumeCapability()) {
			return nil, status.Errorf(codes.AlreadyExists, "volume %q is already staged at %q with other parameters", req.GetVolumeId(), st.path)
		}
		return &csi.NodeStageVolumeResponse{}, nil
	}
	n.staged[req.GetVolumeId()] = nodeStage{path: req.GetStagingTargetPath(), capability: req.GetVolumeCapability()}
	return &csi.NodeStageVolumeResponse{}, nil
}

func (s *nodeServer) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	if err := requireVolumeAndPath(req.GetVolumeId(), "staging target path", req.GetStagingTargetPath()); err != nil {
		return nil, err
	}
	n := s.node
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.staged[req.GetVolumeId()]; !ok {
		if err := s.volumeMustExist(req.GetVolumeId()); err != nil {
			return nil, err
		}
		return &csi.NodeUnstageVolumeResponse{}, nil // idempotent
	}
	if len(n.published[req.GetVolumeId()]) > 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %q is still published on node %q", req.GetVolumeId(), n.id)
	}
	delete(n.staged, req.GetVolumeId())
	return &csi.NodeUnstageVolumeResponse{}, nil
}

func (s *nodeServer) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	volID, target := req.GetVolumeId(), req.GetTargetPath()
	if err := requireVolumeAndPath(volID, "target path", target); err != nil {
		return nil, err
	}
	capability := req.GetVolumeCapability()
	if err := validateCapability(capability, s.d.cfg.Capabilities); err != nil {
		return nil, err
	}
	if req.GetStagingTargetPath() == "" {
		return nil, status.Error(codes.FailedPrecondition, "staging target path is required: STAGE_UNSTAGE_VOLUME is advertised")
	}
	if err := s.volumeMustExist(volID); err != nil {
		return nil, err
	}
	want := nodePublish{stagingPath: req.GetStagingTargetPath(), readonly: req.GetReadonly(), capability: capability}
	n := s.node
	n.mu.Lock()
	defer n.mu.Unlock()
	if st, ok := n.staged[volID]; !ok || st.path != want.stagingPath {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %q is not staged at %q", volID, want.stagingPath)
	}
	targets := n.published[volID]
	if p, ok := targets[target]; ok {
		if p.readonly != want.readonly || p.stagingPath != want.stagingPath || !proto.Equal(p.capability, want.capability) {
			return nil, status.Errorf(codes.AlreadyExists, "volume %q is already published at %q with other parameters", volID, target)
		}
		return &csi.NodePublishVolumeResponse{}, nil
	}
	if capability.GetAccessMode().GetMode() == csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER && len(targets) > 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %q is SINGLE_NODE_SINGLE_WRITER and already published at another target path", volID)
	}
	if err := makeTarget(target, capability.GetBlock() != nil); err != nil {
		return nil, status.Errorf(codes.Internal, "create target path: %v", err)
	}
	if targets == nil {
		targets = map[string]nodePublish{}
		n.published[volID] = targets
	}
	targets[target] = want
	return &csi.NodePublishVolumeResponse{}, nil
}

// makeTarget creates what a mount (directory) or block publish (file)
// would leave at the target path.
func makeTarget(path string, block bool) error {
	if !block {
		return os.MkdirAll(path, 0o750)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o640)
	if err != nil {
		return err
	}
	return f.Close()
}

func (s *nodeServer) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	volID, target := req.GetVolumeId(), req.GetTargetPath()
	if err := requireVolumeAndPath(volID, "target path", target); err != nil {
		return nil, err
	}
	n := s.node
	n.mu.Lock()
	defer n.mu.Unlock()
	targets := n.published[volID]
	if _, ok := targets[target]; !ok {
		if err := s.volumeMustExist(volID); err != nil {
			return nil, err
		}
		return &csi.NodeUnpublishVolumeResponse{}, nil // idempotent
	}
	// The spec: the SP MUST delete the file or directory it created.
	if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, status.Errorf(codes.Internal, "remove target path: %v", fmt.Errorf("%s: %w", target, err))
	}
	delete(targets, target)
	if len(targets) == 0 {
		delete(n.published, volID)
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}
