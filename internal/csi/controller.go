package csi

import (
	"context"
	"fmt"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-lib-utils/connection"
)

// PublishRequest is the input of ControllerPublish.
type PublishRequest struct {
	VolumeID string
	NodeID   string
	// Capability comes from VolumeCapability / VolumeCapabilityFromPVSpec.
	Capability *csipb.VolumeCapability
	// ReadOnly must already account for PUBLISH_READONLY (PublishReadOnly).
	ReadOnly      bool
	VolumeContext map[string]string
	// Secrets from spec.csi.controllerPublishSecretRef; never logged.
	Secrets map[string]string
}

// ControllerPublish calls ControllerPublishVolume.
func (c *GRPCClient) ControllerPublish(ctx context.Context, req PublishRequest) (map[string]string, error) {
	pbReq := &csipb.ControllerPublishVolumeRequest{
		VolumeId:         req.VolumeID,
		NodeId:           req.NodeID,
		VolumeCapability: req.Capability,
		Readonly:         req.ReadOnly,
		Secrets:          req.Secrets,
		VolumeContext:    req.VolumeContext,
	}
	rsp, err := call(ctx, c, "ControllerPublishVolume", pbReq, c.controller.ControllerPublishVolume)
	if err != nil {
		return nil, fmt.Errorf("ControllerPublishVolume volume %q on node %q: %w", req.VolumeID, req.NodeID, err)
	}
	return rsp.GetPublishContext(), nil
}

// ControllerUnpublish calls ControllerUnpublishVolume.
func (c *GRPCClient) ControllerUnpublish(ctx context.Context, volumeID, nodeID string, secrets map[string]string) error {
	pbReq := &csipb.ControllerUnpublishVolumeRequest{VolumeId: volumeID, NodeId: nodeID, Secrets: secrets}
	_, err := call(ctx, c, "ControllerUnpublishVolume", pbReq, c.controller.ControllerUnpublishVolume)
	if err != nil {
		return fmt.Errorf("ControllerUnpublishVolume volume %q from node %q: %w", volumeID, nodeID, err)
	}
	return nil
}

// ListVolumes pages through ListVolumes (maxEntries per page, 0 lets the
// driver choose) and returns volume ID → published node IDs. The per-call
// timeout applies to each page, not to the whole listing. A driver that
// hands back a token it already returned would make this loop forever, so
// that is an error.
func (c *GRPCClient) ListVolumes(ctx context.Context, maxEntries int32) (map[string][]string, error) {
	published := map[string][]string{}
	seen := map[string]bool{}
	token := ""
	for page := 1; ; page++ {
		rsp, err := c.listVolumesPage(ctx, maxEntries, token)
		if err != nil {
			return nil, fmt.Errorf("ListVolumes page %d (starting token %q): %w", page, token, err)
		}
		for _, entry := range rsp.GetEntries() {
			id := entry.GetVolume().GetVolumeId()
			if id == "" {
				continue
			}
			published[id] = append(published[id], entry.GetStatus().GetPublishedNodeIds()...)
		}
		next := rsp.GetNextToken()
		if next == "" {
			return published, nil
		}
		if seen[next] {
			return nil, fmt.Errorf("ListVolumes page %d: driver returned next token %q again; refusing to loop", page, next)
		}
		seen[next] = true
		token = next
	}
}

func (c *GRPCClient) listVolumesPage(ctx context.Context, maxEntries int32, token string) (*csipb.ListVolumesResponse, error) {
	req := &csipb.ListVolumesRequest{MaxEntries: maxEntries, StartingToken: token}
	return call(ctx, c, "ListVolumes", req, c.controller.ListVolumes)
}

// WithMigrated marks the calls made with the returned context as made for
// a volume translated from an in-tree plugin (CSI migration), for the
// migrated label of csi_sidecar_operations_seconds.
func WithMigrated(ctx context.Context, migrated bool) context.Context {
	if !migrated {
		return ctx
	}
	return context.WithValue(ctx, connection.AdditionalInfoKey, connection.AdditionalInfo{Migrated: "true"})
}
