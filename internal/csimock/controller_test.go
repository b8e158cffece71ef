package csimock

import (
	"context"
	"reflect"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/latchcsi/latch/internal/csi/csitest"
)

// TestPublishSemantics drives ControllerPublishVolume and
// ControllerUnpublishVolume over gRPC through every rule of the semantics
// table in docs/csi-mock-driver.md.
func TestPublishSemantics(t *testing.T) {
	publish := func(r *csi.ControllerPublishVolumeRequest) func(context.Context, *env) error {
		return ctrlCall(csi.ControllerClient.ControllerPublishVolume, r)
	}
	readonly := func(r *csi.ControllerPublishVolumeRequest) *csi.ControllerPublishVolumeRequest {
		r.Readonly = true
		return r
	}
	// publishGets checks the device path of a publish that succeeds.
	publishGets := func(t *testing.T, r *csi.ControllerPublishVolumeRequest, devicePath string) func(context.Context, *env) error {
		return func(ctx context.Context, e *env) error {
			resp, err := e.ctrl.ControllerPublishVolume(ctx, r)
			if err == nil && resp.GetPublishContext()["devicePath"] != devicePath {
				t.Errorf("publish context = %v, want devicePath %s", resp.GetPublishContext(), devicePath)
			}
			return err
		}
	}
	cases := []semanticsCase{
		{name: "publish: missing volume id → InvalidArgument", call: publish(pubReq("", "node-a", csitest.SNW)), want: codes.InvalidArgument},
		{name: "publish: missing node id → InvalidArgument", call: publish(pubReq("vol-1", "", csitest.SNW)), want: codes.InvalidArgument},
		{name: "publish: missing capability → InvalidArgument, even for an unknown volume",
			call: publish(&csi.ControllerPublishVolumeRequest{VolumeId: "nope", NodeId: "node-a"}), want: codes.InvalidArgument},
		{name: "publish: capability without access type → InvalidArgument", setup: seeded("vol-1"),
			call: publish(&csi.ControllerPublishVolumeRequest{VolumeId: "vol-1", NodeId: "node-a",
				VolumeCapability: &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: csitest.SNW}}}),
			want: codes.InvalidArgument},
		{name: "publish: unknown volume → NotFound", call: publish(pubReq("vol-x", "node-a", csitest.SNW)), want: codes.NotFound,
			check: func(t *testing.T, e *env) { wantNodes(t, e, "vol-x") }},
		{name: "publish: unknown volume with auto-create → volume created and published", cfg: func(c *Config) { c.AutoCreateVolumes = true },
			call: publish(pubReq("vol-x", "node-a", csitest.SNW)), want: codes.OK,
			check: func(t *testing.T, e *env) { wantNodes(t, e, "vol-x", "node-a") }},
		{name: "publish: node outside the configured known-node set → NotFound", cfg: func(c *Config) { c.KnownNodes = []string{"node-a"} },
			setup: seeded("vol-1"), call: publish(pubReq("vol-1", "node-z", csitest.SNW)), want: codes.NotFound},
		{name: "publish: node added at runtime with SetKnownNodes → OK", cfg: func(c *Config) { c.KnownNodes = []string{"node-a"} },
			setup: func(t *testing.T, e *env) {
				e.seed(t, "vol-1")
				e.d.SetKnownNodes([]string{"node-a", "node-z"})
			},
			call: publish(pubReq("vol-1", "node-z", csitest.SNW)), want: codes.OK},
		{name: "publish: any node ID accepted by default, publish context has a device path", setup: seeded("vol-1"),
			call: publishGets(t, pubReq("vol-1", "whatever-node", csitest.SNW), "/dev/mock/1"), want: codes.OK,
			check: func(t *testing.T, e *env) { wantNodes(t, e, "vol-1", "whatever-node") }},
		{name: "publish: repeat to the same node with the same capability → OK, same publish context, counted as duplicate",
			setup: func(t *testing.T, e *env) {
				e.seed(t, "vol-1", "vol-2")
				e.mustPublish(t, "vol-2", "node-a", csitest.SNW) // takes /dev/mock/1
				e.mustPublish(t, "vol-1", "node-a", csitest.SNW)
			},
			call: publishGets(t, pubReq("vol-1", "node-a", csitest.SNW), "/dev/mock/2"), want: codes.OK,
			check: func(t *testing.T, e *env) {
				st := e.d.Stats().Publish
				if st.DuplicatePublishes != 1 || e.d.PublishCount("vol-1", "node-a") != 2 {
					t.Errorf("duplicates = %d, pair publishes = %d; want 1 and 2", st.DuplicatePublishes, e.d.PublishCount("vol-1", "node-a"))
				}
			}},
		{name: "publish: repeat to the same node with readonly mismatch → AlreadyExists", setup: publishedTo("vol-1", csitest.SNW, "node-a"),
			call: publish(readonly(pubReq("vol-1", "node-a", csitest.SNW))), want: codes.AlreadyExists},
		{name: "publish: repeat to the same node with a different capability → AlreadyExists", setup: publishedTo("vol-1", csitest.SNW, "node-a"),
			call: publish(&csi.ControllerPublishVolumeRequest{VolumeId: "vol-1", NodeId: "node-a", VolumeCapability: csitest.Block(csitest.SNW)}), want: codes.AlreadyExists},
		{name: "publish: single-node writer already published to node-a, publish to node-b → FailedPrecondition", setup: publishedTo("vol-1", csitest.SNW, "node-a"),
			call: publish(pubReq("vol-1", "node-b", csitest.SNW)), want: codes.FailedPrecondition,
			check: func(t *testing.T, e *env) {
				wantNodes(t, e, "vol-1", "node-a")
				st := e.d.Stats().Publish
				want := []SingleNodeEvent{{VolumeID: "vol-1", NodeID: "node-b", OtherNodes: []string{"node-a"}}}
				if !reflect.DeepEqual(st.SingleNodeConflictAttempts, want) || st.SingleNodeViolationsTotal != 0 || st.MaxSingleNodePublishedNodes != 1 {
					t.Errorf("publish stats = %+v, want one recorded attempt, no violation, max 1 node", st)
				}
			}},
	}
	// A volume published to node-a in the first mode, then published to
	// node-b in the second.
	for _, tc := range []struct {
		name       string
		held, next csi.VolumeCapability_AccessMode_Mode
		want       codes.Code
	}{
		{"publish: single-node reader-only already published to node-a, publish to node-b → FailedPrecondition", csitest.SNRO, csitest.SNRO, codes.FailedPrecondition},
		{"publish: single-node single-writer already published to node-a, publish to node-b → FailedPrecondition", csitest.SNSW, csitest.SNSW, codes.FailedPrecondition},
		{"publish: single-node multi-writer already published to node-a, publish to node-b → FailedPrecondition", csitest.SNMW, csitest.SNMW, codes.FailedPrecondition},
		{"publish: multi-node request while a single-node publication holds node-a → FailedPrecondition", csitest.SNW, csitest.MNMW, codes.FailedPrecondition},
	} {
		cases = append(cases, semanticsCase{name: tc.name, setup: publishedTo("vol-1", tc.held, "node-a"),
			call: publish(pubReq("vol-1", "node-b", tc.next)), want: tc.want})
	}
	cases = append(cases, []semanticsCase{
		{name: "publish: multi-node multi-writer published to node-a, publish to node-b → OK", setup: publishedTo("vol-1", csitest.MNMW, "node-a"),
			call: publish(pubReq("vol-1", "node-b", csitest.MNMW)), want: codes.OK,
			check: func(t *testing.T, e *env) { wantNodes(t, e, "vol-1", "node-a", "node-b") }},
		{name: "publish: single-node check skipped, second node → OK and the violation is recorded", cfg: func(c *Config) { c.SkipSingleNodeCheck = true },
			setup: publishedTo("vol-1", csitest.SNW, "node-a"), call: publish(pubReq("vol-1", "node-b", csitest.SNW)), want: codes.OK,
			check: func(t *testing.T, e *env) {
				st := e.d.Stats().Publish
				want := []SingleNodeEvent{{VolumeID: "vol-1", NodeID: "node-b", OtherNodes: []string{"node-a"}}}
				if !reflect.DeepEqual(st.SingleNodeViolations, want) || st.MaxSingleNodePublishedNodes != 2 {
					t.Errorf("publish stats = %+v, want the violation on node-b and max 2 nodes", st)
				}
			}},
		{name: "publish: node already at its attach limit → ResourceExhausted", cfg: func(c *Config) { c.MaxVolumesPerNode = 2 },
			setup: func(t *testing.T, e *env) {
				e.seed(t, "vol-1", "vol-2", "vol-3")
				e.mustPublish(t, "vol-1", "node-a", csitest.SNW)
				e.mustPublish(t, "vol-2", "node-a", csitest.SNW)
			},
			call: publish(pubReq("vol-3", "node-a", csitest.SNW)), want: codes.ResourceExhausted},
		{name: "publish: idempotent repeat on a node at its attach limit → OK", cfg: func(c *Config) { c.MaxVolumesPerNode = 1 },
			setup: publishedTo("vol-1", csitest.SNW, "node-a"), call: publish(pubReq("vol-1", "node-a", csitest.SNW)), want: codes.OK},
		{name: "publish: attach limit frees up after unpublish → OK", cfg: func(c *Config) { c.MaxVolumesPerNode = 1 },
			setup: func(t *testing.T, e *env) {
				e.seed(t, "vol-1", "vol-2")
				e.mustPublish(t, "vol-1", "node-a", csitest.SNW)
				if _, err := e.ctrl.ControllerUnpublishVolume(testCtx(t), &csi.ControllerUnpublishVolumeRequest{VolumeId: "vol-1", NodeId: "node-a"}); err != nil {
					t.Fatal(err)
				}
			},
			call: publish(pubReq("vol-2", "node-a", csitest.SNW)), want: codes.OK},
		{name: "publish: readonly without the PUBLISH_READONLY capability → InvalidArgument", cfg: func(c *Config) { c.Capabilities.PublishReadonly = false },
			setup: seeded("vol-1"), call: publish(readonly(pubReq("vol-1", "node-a", csitest.SNW))), want: codes.InvalidArgument},
		{name: "publish: SINGLE_NODE_MULTI_WRITER mode without the capability → InvalidArgument", cfg: func(c *Config) { c.Capabilities.SingleNodeMultiWriter = false },
			setup: seeded("vol-1"), call: publish(pubReq("vol-1", "node-a", csitest.SNMW)), want: codes.InvalidArgument},
		{name: "publish: PUBLISH_UNPUBLISH_VOLUME disabled → Unimplemented", cfg: func(c *Config) { c.Capabilities.PublishUnpublishVolume = false },
			setup: seeded("vol-1"), call: publish(pubReq("vol-1", "node-a", csitest.SNW)), want: codes.Unimplemented},
	}...)
	runSemantics(t, cases)
}

// semanticsCase is one row of the semantics table.
type semanticsCase struct {
	name  string
	cfg   func(*Config)
	setup func(t *testing.T, e *env)
	call  func(ctx context.Context, e *env) error
	want  codes.Code
	check func(t *testing.T, e *env)
}

// runSemantics runs each case on a driver of its own.
func runSemantics(t *testing.T, tests []semanticsCase) {
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			e := newEnv(t, cfg)
			if tc.setup != nil {
				tc.setup(t, e)
			}
			wantCode(t, tc.call(testCtx(t), e), tc.want)
			if tc.check != nil {
				tc.check(t, e)
			}
		})
	}
}

// ctrlCall is a row's call: one controller RPC whose response the row
// does not look at (method is e.g. csi.ControllerClient.DeleteVolume).
func ctrlCall[Req, Resp any](method func(csi.ControllerClient, context.Context, Req, ...grpc.CallOption) (Resp, error), req Req) func(context.Context, *env) error {
	return func(ctx context.Context, e *env) error {
		_, err := method(e.ctrl, ctx, req)
		return err
	}
}

// seeded is a row's setup: the volumes exist, published nowhere.
func seeded(vols ...string) func(*testing.T, *env) {
	return func(t *testing.T, e *env) { e.seed(t, vols...) }
}

// publishedTo is a row's setup: vol exists and is published to nodes with
// mode.
func publishedTo(vol string, mode csi.VolumeCapability_AccessMode_Mode, nodes ...string) func(*testing.T, *env) {
	return func(t *testing.T, e *env) {
		e.seed(t, vol)
		for _, n := range nodes {
			e.mustPublish(t, vol, n, mode)
		}
	}
}

func wantNodes(t *testing.T, e *env, vol string, nodes ...string) {
	t.Helper()
	got := e.d.Published(vol)
	if len(got) == 0 && len(nodes) == 0 {
		return
	}
	if !reflect.DeepEqual(got, nodes) {
		t.Errorf("Published(%s) = %v, want %v", vol, got, nodes)
	}
}

func createReq(name string, size int64) *csi.CreateVolumeRequest {
	return &csi.CreateVolumeRequest{
		Name:               name,
		CapacityRange:      &csi.CapacityRange{RequiredBytes: size, LimitBytes: size},
		VolumeCapabilities: []*csi.VolumeCapability{csitest.Mount(csitest.SNW, "")},
	}
}

func mustCreate(t *testing.T, e *env, name string, size int64) string {
	t.Helper()
	resp, err := e.ctrl.CreateVolume(testCtx(t), createReq(name, size))
	if err != nil {
		t.Fatalf("CreateVolume(%s): %v", name, err)
	}
	return resp.GetVolume().GetVolumeId()
}
