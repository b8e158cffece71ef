package csimock

import (
	"context"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/latchcsi/latch/internal/csi/csitest"
)

// TestUnpublishAndVolumeSemantics is the rest of the semantics table in
// docs/csi-mock-driver.md (TestPublishSemantics has the publish rows):
// unpublish, create, delete, validate and the controller service itself.
func TestUnpublishAndVolumeSemantics(t *testing.T) {
	unpublish := func(vol, node string) func(context.Context, *env) error {
		return ctrlCall(csi.ControllerClient.ControllerUnpublishVolume, &csi.ControllerUnpublishVolumeRequest{VolumeId: vol, NodeId: node})
	}
	create := func(r *csi.CreateVolumeRequest) func(context.Context, *env) error {
		return ctrlCall(csi.ControllerClient.CreateVolume, r)
	}
	deleteVol := func(vol string) func(context.Context, *env) error {
		return ctrlCall(csi.ControllerClient.DeleteVolume, &csi.DeleteVolumeRequest{VolumeId: vol})
	}
	created := func(name string, size int64) func(*testing.T, *env) {
		return func(t *testing.T, e *env) { mustCreate(t, e, name, size) }
	}
	runSemantics(t, []semanticsCase{
		{name: "unpublish: missing volume id → InvalidArgument", call: unpublish("", "node-a"), want: codes.InvalidArgument},
		{name: "unpublish: unknown volume → OK", call: unpublish("vol-x", "node-a"), want: codes.OK},
		{name: "unpublish: volume not published to that node → OK, other node untouched", setup: publishedTo("vol-1", csitest.SNW, "node-a"),
			call: unpublish("vol-1", "node-b"), want: codes.OK,
			check: func(t *testing.T, e *env) { wantNodes(t, e, "vol-1", "node-a") }},
		{name: "unpublish: published volume → removed from the node", setup: publishedTo("vol-1", csitest.SNW, "node-a"),
			call: unpublish("vol-1", "node-a"), want: codes.OK,
			check: func(t *testing.T, e *env) {
				wantNodes(t, e, "vol-1")
				if n := e.d.State().NodeVolumes["node-a"]; n != 0 {
					t.Errorf("node-a volume count = %d, want 0", n)
				}
			}},
		{name: "unpublish: empty node id → unpublished from every node", setup: publishedTo("vol-1", csitest.MNRO, "node-a", "node-b"),
			call: unpublish("vol-1", ""), want: codes.OK,
			check: func(t *testing.T, e *env) { wantNodes(t, e, "vol-1") }},
		{name: "create: missing name → InvalidArgument",
			call: create(&csi.CreateVolumeRequest{VolumeCapabilities: []*csi.VolumeCapability{csitest.Mount(csitest.SNW, "")}}), want: codes.InvalidArgument},
		{name: "create: missing capabilities → InvalidArgument", call: create(&csi.CreateVolumeRequest{Name: "pv-1"}), want: codes.InvalidArgument},
		{name: "create: same name and compatible size → OK, same volume ID", setup: created("pv-1", 1<<30),
			call: func(ctx context.Context, e *env) error {
				resp, err := e.ctrl.CreateVolume(ctx, createReq("pv-1", 1<<30))
				if err == nil && resp.GetVolume().GetVolumeId() != volumeIDForName("pv-1") {
					t.Errorf("volume ID = %q, want %q", resp.GetVolume().GetVolumeId(), volumeIDForName("pv-1"))
				}
				return err
			},
			want: codes.OK},
		{name: "create: same name, larger size → AlreadyExists", setup: created("pv-1", 1<<30), call: create(createReq("pv-1", 2<<30)), want: codes.AlreadyExists},
		{name: "delete: missing volume id → InvalidArgument", call: deleteVol(""), want: codes.InvalidArgument},
		{name: "delete: unknown volume → OK", call: deleteVol("vol-x"), want: codes.OK},
		{name: "delete: volume still published → FailedPrecondition", setup: publishedTo("vol-1", csitest.SNW, "node-a"), call: deleteVol("vol-1"), want: codes.FailedPrecondition},
		{name: "validate: unknown volume → NotFound",
			call: ctrlCall(csi.ControllerClient.ValidateVolumeCapabilities,
				&csi.ValidateVolumeCapabilitiesRequest{VolumeId: "vol-x", VolumeCapabilities: []*csi.VolumeCapability{csitest.Mount(csitest.SNW, "")}}),
			want: codes.NotFound},
		{name: "controller: CreateSnapshot → Unimplemented",
			call: ctrlCall(csi.ControllerClient.CreateSnapshot, &csi.CreateSnapshotRequest{Name: "s", SourceVolumeId: "v"}), want: codes.Unimplemented},
		{name: "controller: CONTROLLER_SERVICE disabled → ControllerGetCapabilities Unimplemented", cfg: func(c *Config) { c.Capabilities.ControllerService = false },
			call: ctrlCall(csi.ControllerClient.ControllerGetCapabilities, &csi.ControllerGetCapabilitiesRequest{}), want: codes.Unimplemented},
	})
}
