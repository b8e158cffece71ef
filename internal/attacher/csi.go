package attacher

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/latchcsi/latch/internal/csi"
)

// CSIClient is what the attacher needs from the driver; internal/csi's
// client satisfies it. Implementations must be safe for concurrent use and
// must not log secrets.
type CSIClient interface {
	// ControllerPublish publishes a volume to a node and returns the
	// publish context. It is idempotent for the same arguments.
	ControllerPublish(ctx context.Context, req csi.PublishRequest) (map[string]string, error)
	// ControllerUnpublish unpublishes a volume from a node; unpublishing a
	// volume that is not published succeeds.
	ControllerUnpublish(ctx context.Context, volumeID, nodeID string, secrets map[string]string) error
	// ListVolumes pages through ListVolumes and returns, per volume ID,
	// the node IDs the driver reports it published to.
	ListVolumes(ctx context.Context, maxEntries int32) (map[string][]string, error)
}

var _ CSIClient = (csi.Client)(nil)

// grpcCode returns err's gRPC status code, false for non-gRPC errors.
func grpcCode(err error) (codes.Code, bool) {
	if err == nil {
		return codes.OK, true
	}
	s, ok := status.FromError(err)
	if !ok {
		return codes.Unknown, false
	}
	return s.Code(), true
}
