package attacher

import (
	"context"
	"fmt"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
)

// grpcCSI implements CSIClient on a gRPC connection to the driver. The
// connection (from csi-lib-utils) already logs requests with secrets
// stripped and records csi_sidecar_operations_seconds.
type grpcCSI struct {
	ctrl csipb.ControllerClient
}

var _ CSIClient = (*grpcCSI)(nil)

// NewGRPCClient returns a CSIClient over conn.
func NewGRPCClient(conn *grpc.ClientConn) CSIClient {
	return &grpcCSI{ctrl: csipb.NewControllerClient(conn)}
}

func (g *grpcCSI) ControllerPublish(ctx context.Context, req PublishRequest) (map[string]string, error) {
	rsp, err := g.ctrl.ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{
		VolumeId:         req.VolumeID,
		NodeId:           req.NodeID,
		VolumeCapability: req.Capability,
		Readonly:         req.ReadOnly,
		Secrets:          req.Secrets,
		VolumeContext:    req.VolumeContext,
	})
	if err != nil {
		return nil, err
	}
	return rsp.GetPublishContext(), nil
}

func (g *grpcCSI) ControllerUnpublish(ctx context.Context, volumeID, nodeID string, secrets map[string]string) error {
	_, err := g.ctrl.ControllerUnpublishVolume(ctx, &csipb.ControllerUnpublishVolumeRequest{
		VolumeId: volumeID, NodeId: nodeID, Secrets: secrets,
	})
	return err
}

// ListPublished pages through ListVolumes. A page loop that does not
// advance (the driver returns the token it was given) is an error rather
// than an endless loop.
func (g *grpcCSI) ListPublished(ctx context.Context, maxEntries int) (map[string][]string, error) {
	out := map[string][]string{}
	token := ""
	for {
		rsp, err := g.ctrl.ListVolumes(ctx, &csipb.ListVolumesRequest{MaxEntries: int32(maxEntries), StartingToken: token})
		if err != nil {
			return nil, fmt.Errorf("ListVolumes (starting token %q): %w", token, err)
		}
		for _, e := range rsp.GetEntries() {
			id := e.GetVolume().GetVolumeId()
			out[id] = append(out[id], e.GetStatus().GetPublishedNodeIds()...)
		}
		next := rsp.GetNextToken()
		if next == "" {
			return out, nil
		}
		if next == token {
			return nil, fmt.Errorf("ListVolumes returned the same next token %q twice", next)
		}
		token = next
	}
}
