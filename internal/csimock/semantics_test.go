package csimock

import (
	"context"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
)

// TestUnpublishAndVolumeSemantics is the rest of the semantics table in
// docs/csi-mock-driver.md (TestPublishSemantics has the publish rows):
// unpublish, create, delete, validate and the controller service itself.
func TestUnpublishAndVolumeSemantics(t *testing.T) {
	runSemantics(t, []semanticsCase{
		{
			name: "unpublish: missing volume id → InvalidArgument",
			call: func(ctx context.Context, e *env) error {
				_, err := e.ctrl.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{NodeId: "node-a"})
				return err
			},
			want: codes.InvalidArgument,
		},
		{
			name: "unpublish: unknown volume → OK",
			call: func(ctx context.Context, e *env) error {
				_, err := e.ctrl.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: "vol-x", NodeId: "node-a"})
				return err
			},
			want: codes.OK,
		},
		{
			name: "unpublish: volume not published to that node → OK, other node untouched",
			setup: func(t *testing.T, e *env) {
				e.seed(t, "vol-1")
				e.mustPublish(t, "vol-1", "node-a", snw)
			},
			call: func(ctx context.Context, e *env) error {
				_, err := e.ctrl.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: "vol-1", NodeId: "node-b"})
				return err
			},
			want:  codes.OK,
			check: func(t *testing.T, e *env) { wantNodes(t, e, "vol-1", "node-a") },
		},
		{
			name: "unpublish: published volume → removed from the node",
			setup: func(t *testing.T, e *env) {
				e.seed(t, "vol-1")
				e.mustPublish(t, "vol-1", "node-a", snw)
			},
			call: func(ctx context.Context, e *env) error {
				_, err := e.ctrl.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: "vol-1", NodeId: "node-a"})
				return err
			},
			want: codes.OK,
			check: func(t *testing.T, e *env) {
				wantNodes(t, e, "vol-1")
				if n := e.d.State().NodeVolumes["node-a"]; n != 0 {
					t.Errorf("node-a volume count = %d, want 0", n)
				}
			},
		},
		{
			name: "unpublish: empty node id → unpublished from every node",
			setup: func(t *testing.T, e *env) {
				e.seed(t, "vol-1")
				e.mustPublish(t, "vol-1", "node-a", mnro)
				e.mustPublish(t, "vol-1", "node-b", mnro)
			},
			call: func(ctx context.Context, e *env) error {
				_, err := e.ctrl.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: "vol-1"})
				return err
			},
			want:  codes.OK,
			check: func(t *testing.T, e *env) { wantNodes(t, e, "vol-1") },
		},
		{
			name: "create: missing name → InvalidArgument",
			call: func(ctx context.Context, e *env) error {
				_, err := e.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{VolumeCapabilities: []*csi.VolumeCapability{mountCap(snw)}})
				return err
			},
			want: codes.InvalidArgument,
		},
		{
			name: "create: missing capabilities → InvalidArgument",
			call: func(ctx context.Context, e *env) error {
				_, err := e.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pv-1"})
				return err
			},
			want: codes.InvalidArgument,
		},
		{
			name:  "create: same name and compatible size → OK, same volume ID",
			setup: func(t *testing.T, e *env) { mustCreate(t, e, "pv-1", 1<<30) },
			call: func(ctx context.Context, e *env) error {
				resp, err := e.ctrl.CreateVolume(ctx, createReq("pv-1", 1<<30))
				if err == nil && resp.GetVolume().GetVolumeId() != volumeIDForName("pv-1") {
					t.Errorf("volume ID = %q, want %q", resp.GetVolume().GetVolumeId(), volumeIDForName("pv-1"))
				}
				return err
			},
			want: codes.OK,
		},
		{
			name:  "create: same name, larger size → AlreadyExists",
			setup: func(t *testing.T, e *env) { mustCreate(t, e, "pv-1", 1<<30) },
			call: func(ctx context.Context, e *env) error {
				_, err := e.ctrl.CreateVolume(ctx, createReq("pv-1", 2<<30))
				return err
			},
			want: codes.AlreadyExists,
		},
		{
			name: "delete: missing volume id → InvalidArgument",
			call: func(ctx context.Context, e *env) error {
				_, err := e.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{})
				return err
			},
			want: codes.InvalidArgument,
		},
		{
			name: "delete: unknown volume → OK",
			call: func(ctx context.Context, e *env) error {
				_, err := e.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: "vol-x"})
				return err
			},
			want: codes.OK,
		},
		{
			name: "delete: volume still published → FailedPrecondition",
			setup: func(t *testing.T, e *env) {
				e.seed(t, "vol-1")
				e.mustPublish(t, "vol-1", "node-a", snw)
			},
			call: func(ctx context.Context, e *env) error {
				_, err := e.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: "vol-1"})
				return err
			},
			want: codes.FailedPrecondition,
		},
		{
			name: "validate: unknown volume → NotFound",
			call: func(ctx context.Context, e *env) error {
				_, err := e.ctrl.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: "vol-x", VolumeCapabilities: []*csi.VolumeCapability{mountCap(snw)}})
				return err
			},
			want: codes.NotFound,
		},
		{
			name: "controller: CreateSnapshot → Unimplemented",
			call: func(ctx context.Context, e *env) error {
				_, err := e.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "s", SourceVolumeId: "v"})
				return err
			},
			want: codes.Unimplemented,
		},
		{
			name: "controller: CONTROLLER_SERVICE disabled → ControllerGetCapabilities Unimplemented",
			cfg:  func(c *Config) { c.Capabilities.ControllerService = false },
			call: func(ctx context.Context, e *env) error {
				_, err := e.ctrl.ControllerGetCapabilities(ctx, &csi.ControllerGetCapabilitiesRequest{})
				return err
			},
			want: codes.Unimplemented,
		},
	})
}
