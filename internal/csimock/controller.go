package csimock

import (
	"context"
	"maps"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// controllerServer is the gRPC face of the store. Everything it does not
// implement returns Unimplemented through the embedded type.
type controllerServer struct {
	csi.UnimplementedControllerServer
	d *Driver
}

var _ csi.ControllerServer = (*controllerServer)(nil)

// require returns Unimplemented unless the controller service and the
// given capability (if any) are enabled, as the spec asks of an RPC that is
// "disabled in the Plugin's current mode of operation".
func (s *controllerServer) require(enabled bool, what string) error {
	if !s.d.cfg.Capabilities.ControllerService {
		return status.Error(codes.Unimplemented, "controller service is disabled")
	}
	if !enabled {
		return status.Errorf(codes.Unimplemented, "%s capability is disabled", what)
	}
	return nil
}

func (s *controllerServer) ControllerGetCapabilities(ctx context.Context, _ *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	if err := s.require(true, ""); err != nil {
		return nil, err
	}
	c := s.d.cfg.Capabilities
	resp := &csi.ControllerGetCapabilitiesResponse{}
	for _, e := range []struct {
		on bool
		t  csi.ControllerServiceCapability_RPC_Type
	}{
		{c.CreateDeleteVolume, csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME},
		{c.PublishUnpublishVolume, csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME},
		{c.PublishReadonly, csi.ControllerServiceCapability_RPC_PUBLISH_READONLY},
		{c.ListVolumes, csi.ControllerServiceCapability_RPC_LIST_VOLUMES},
		{c.ListVolumesPublishedNodes, csi.ControllerServiceCapability_RPC_LIST_VOLUMES_PUBLISHED_NODES},
		{c.SingleNodeMultiWriter, csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER},
	} {
		if e.on {
			resp.Capabilities = append(resp.Capabilities, &csi.ControllerServiceCapability{
				Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: e.t}},
			})
		}
	}
	return resp, nil
}

func (s *controllerServer) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	if err := s.require(s.d.cfg.Capabilities.CreateDeleteVolume, "CREATE_DELETE_VOLUME"); err != nil {
		return nil, err
	}
	a := createArgs{
		Name:         req.GetName(),
		Required:     req.GetCapacityRange().GetRequiredBytes(),
		Limit:        req.GetCapacityRange().GetLimitBytes(),
		Parameters:   req.GetParameters(),
		Capabilities: req.GetVolumeCapabilities(),
	}
	if err := validateCreate(a, s.d.cfg.Capabilities); err != nil {
		return nil, err
	}
	if req.GetVolumeContentSource() != nil {
		// Neither snapshots nor cloning are advertised.
		return nil, status.Error(codes.InvalidArgument, "volume content sources are not supported")
	}
	v, err := s.d.state.createVolume(callRefFrom(ctx), a)
	if err != nil {
		return nil, err
	}
	return &csi.CreateVolumeResponse{Volume: csiVolume(v)}, nil
}

func csiVolume(v *volume) *csi.Volume {
	return &csi.Volume{VolumeId: v.ID, CapacityBytes: v.CapacityBytes, VolumeContext: maps.Clone(v.Parameters)}
}

func (s *controllerServer) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	if err := s.require(s.d.cfg.Capabilities.CreateDeleteVolume, "CREATE_DELETE_VOLUME"); err != nil {
		return nil, err
	}
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID is required")
	}
	if err := s.d.state.deleteVolume(callRefFrom(ctx), req.GetVolumeId()); err != nil {
		return nil, err
	}
	return &csi.DeleteVolumeResponse{}, nil
}

func (s *controllerServer) ControllerPublishVolume(ctx context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	if err := s.require(s.d.cfg.Capabilities.PublishUnpublishVolume, "PUBLISH_UNPUBLISH_VOLUME"); err != nil {
		return nil, err
	}
	a := publishArgs{
		VolumeID:   req.GetVolumeId(),
		NodeID:     req.GetNodeId(),
		Readonly:   req.GetReadonly(),
		Capability: req.GetVolumeCapability(),
	}
	if err := validatePublish(a, s.d.cfg.Capabilities); err != nil {
		return nil, err
	}
	pc, err := s.d.state.publish(callRefFrom(ctx), a, &s.d.cfg)
	if err != nil {
		return nil, err
	}
	if extra := s.d.extraPublishContext.Load(); extra != nil {
		maps.Copy(pc, *extra)
	}
	return &csi.ControllerPublishVolumeResponse{PublishContext: pc}, nil
}

func (s *controllerServer) ControllerUnpublishVolume(ctx context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	if err := s.require(s.d.cfg.Capabilities.PublishUnpublishVolume, "PUBLISH_UNPUBLISH_VOLUME"); err != nil {
		return nil, err
	}
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID is required")
	}
	if err := s.d.state.unpublish(callRefFrom(ctx), req.GetVolumeId(), req.GetNodeId()); err != nil {
		return nil, err
	}
	return &csi.ControllerUnpublishVolumeResponse{}, nil
}

// ValidateVolumeCapabilities is required of every controller plugin; the
// mock confirms any well-formed capability of an existing volume.
func (s *controllerServer) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	if err := s.require(true, ""); err != nil {
		return nil, err
	}
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID is required")
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "volume capabilities are required")
	}
	if !s.d.state.volumeExists(req.GetVolumeId()) {
		return nil, status.Errorf(codes.NotFound, "volume %q does not exist", req.GetVolumeId())
	}
	for _, c := range req.GetVolumeCapabilities() {
		if err := validateCapability(c, s.d.cfg.Capabilities); err != nil {
			// Unsupported capabilities are reported by leaving Confirmed empty.
			return &csi.ValidateVolumeCapabilitiesResponse{Message: status.Convert(err).Message()}, nil
		}
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}

func (s *controllerServer) ListVolumes(ctx context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	if err := s.require(s.d.cfg.Capabilities.ListVolumes, "LIST_VOLUMES"); err != nil {
		return nil, err
	}
	if req.GetMaxEntries() < 0 {
		return nil, status.Error(codes.InvalidArgument, "max_entries must not be negative")
	}
	page, err := s.d.state.listVolumes(req.GetStartingToken(), int(req.GetMaxEntries()))
	if err != nil {
		return nil, err
	}
	resp := &csi.ListVolumesResponse{NextToken: page.next}
	withNodes := s.d.cfg.Capabilities.ListVolumesPublishedNodes
	for _, e := range page.entries {
		entry := &csi.ListVolumesResponse_Entry{Volume: e.volume}
		if withNodes {
			// Required whenever LIST_VOLUMES_PUBLISHED_NODES is advertised;
			// an empty list means "published nowhere".
			entry.Status = &csi.ListVolumesResponse_VolumeStatus{PublishedNodeIds: e.nodes}
		}
		resp.Entries = append(resp.Entries, entry)
	}
	return resp, nil
}
