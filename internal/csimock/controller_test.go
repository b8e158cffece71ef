package csimock

import (
	"context"
	"reflect"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
)

// TestPublishSemantics drives ControllerPublishVolume and
// ControllerUnpublishVolume over gRPC through every rule of the semantics
// table in docs/csi-mock-driver.md.
func TestPublishSemantics(t *testing.T) {
	runSemantics(t, []semanticsCase{
		{
			name: "publish: missing volume id → InvalidArgument",
			call: func(ctx context.Context, e *env) error {
				_, err := e.ctrl.ControllerPublishVolume(ctx, pubReq("", "node-a", snw))
				return err
			},
			want: codes.InvalidArgument,
		},
		{
			name: "publish: missing node id → InvalidArgument",
			call: func(ctx context.Context, e *env) error {
				_, err := e.ctrl.ControllerPublishVolume(ctx, pubReq("vol-1", "", snw))
				return err
			},
			want: codes.InvalidArgument,
		},
		{
			name: "publish: missing capability → InvalidArgument, even for an unknown volume",
			call: func(ctx context.Context, e *env) error {
				_, err := e.ctrl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: "nope", NodeId: "node-a"})
				return err
			},
			want: codes.InvalidArgument,
		},
		{
			name:  "publish: capability without access type → InvalidArgument",
			setup: func(t *testing.T, e *env) { e.seed(t, "vol-1") },
			call: func(ctx context.Context, e *env) error {
				_, err := e.ctrl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: "vol-1", NodeId: "node-a",
					VolumeCapability: &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: snw}}})
				return err
			},
			want: codes.InvalidArgument,
		},
		{
			name: "publish: unknown volume → NotFound",
			call: func(ctx context.Context, e *env) error {
				_, err := e.ctrl.ControllerPublishVolume(ctx, pubReq("vol-x", "node-a", snw))
				return err
			},
			want:  codes.NotFound,
			check: func(t *testing.T, e *env) { wantNodes(t, e, "vol-x") },
		},
		{
			name: "publish: unknown volume with auto-create → volume created and published",
			cfg:  func(c *Config) { c.AutoCreateVolumes = true },
			call: func(ctx context.Context, e *env) error {
				_, err := e.ctrl.ControllerPublishVolume(ctx, pubReq("vol-x", "node-a", snw))
				return err
			},
			want:  codes.OK,
			check: func(t *testing.T, e *env) { wantNodes(t, e, "vol-x", "node-a") },
		},
		{
			name:  "publish: node outside the configured known-node set → NotFound",
			cfg:   func(c *Config) { c.KnownNodes = []string{"node-a"} },
			setup: func(t *testing.T, e *env) { e.seed(t, "vol-1") },
			call: func(ctx context.Context, e *env) error {
				_, err := e.ctrl.ControllerPublishVolume(ctx, pubReq("vol-1", "node-z", snw))
				return err
			},
			want: codes.NotFound,
		},
		{
			name: "publish: node added at runtime with SetKnownNodes → OK",
			cfg:  func(c *Config) { c.KnownNodes = []string{"node-a"} },
			setup: func(t *testing.T, e *env) {
				e.seed(t, "vol-1")
				e.d.SetKnownNodes([]string{"node-a", "node-z"})
			},
			call: func(ctx context.Context, e *env) error {
				_, err := e.ctrl.ControllerPublishVolume(ctx, pubReq("vol-1", "node-z", snw))
				return err
			},
			want: codes.OK,
		},
		{
			name:  "publish: any node ID accepted by default, publish context has a device path",
			setup: func(t *testing.T, e *env) { e.seed(t, "vol-1") },
			call: func(ctx context.Context, e *env) error {
				resp, err := e.ctrl.ControllerPublishVolume(ctx, pubReq("vol-1", "whatever-node", snw))
				if err == nil && resp.GetPublishContext()["devicePath"] != "/dev/mock/1" {
					t.Errorf("publish context = %v, want devicePath /dev/mock/1", resp.GetPublishContext())
				}
				return err
			},
			want:  codes.OK,
			check: func(t *testing.T, e *env) { wantNodes(t, e, "vol-1", "whatever-node") },
		},
		{
			name: "publish: repeat to the same node with the same capability → OK, same publish context, counted as duplicate",
			setup: func(t *testing.T, e *env) {
				e.seed(t, "vol-1", "vol-2")
				e.mustPublish(t, "vol-2", "node-a", snw) // takes /dev/mock/1
				e.mustPublish(t, "vol-1", "node-a", snw)
			},
			call: func(ctx context.Context, e *env) error {
				resp, err := e.ctrl.ControllerPublishVolume(ctx, pubReq("vol-1", "node-a", snw))
				if err == nil && resp.GetPublishContext()["devicePath"] != "/dev/mock/2" {
					t.Errorf("publish context = %v, want the original /dev/mock/2", resp.GetPublishContext())
				}
				return err
			},
			want: codes.OK,
			check: func(t *testing.T, e *env) {
				st := e.d.Stats().Publish
				if st.DuplicatePublishes != 1 || e.d.PublishCount("vol-1", "node-a") != 2 {
					t.Errorf("duplicates = %d, pair publishes = %d; want 1 and 2", st.DuplicatePublishes, e.d.PublishCount("vol-1", "node-a"))
				}
			},
		},
		{
			name: "publish: repeat to the same node with readonly mismatch → AlreadyExists",
			setup: func(t *testing.T, e *env) {
				e.seed(t, "vol-1")
				e.mustPublish(t, "vol-1", "node-a", snw)
			},
			call: func(ctx context.Context, e *env) error {
				r := pubReq("vol-1", "node-a", snw)
				r.Readonly = true
				_, err := e.ctrl.ControllerPublishVolume(ctx, r)
				return err
			},
			want: codes.AlreadyExists,
		},
		{
			name: "publish: repeat to the same node with a different capability → AlreadyExists",
			setup: func(t *testing.T, e *env) {
				e.seed(t, "vol-1")
				e.mustPublish(t, "vol-1", "node-a", snw)
			},
			call: func(ctx context.Context, e *env) error {
				_, err := e.ctrl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: "vol-1", NodeId: "node-a", VolumeCapability: blockCap(snw)})
				return err
			},
			want: codes.AlreadyExists,
		},
		{
			name: "publish: single-node writer already published to node-a, publish to node-b → FailedPrecondition",
			setup: func(t *testing.T, e *env) {
				e.seed(t, "vol-1")
				e.mustPublish(t, "vol-1", "node-a", snw)
			},
			call: func(ctx context.Context, e *env) error {
				_, err := e.ctrl.ControllerPublishVolume(ctx, pubReq("vol-1", "node-b", snw))
				return err
			},
			want: codes.FailedPrecondition,
			check: func(t *testing.T, e *env) {
				wantNodes(t, e, "vol-1", "node-a")
				st := e.d.Stats().Publish
				want := []SingleNodeEvent{{VolumeID: "vol-1", NodeID: "node-b", OtherNodes: []string{"node-a"}}}
				if !reflect.DeepEqual(st.SingleNodeConflictAttempts, want) || st.SingleNodeViolationsTotal != 0 || st.MaxSingleNodePublishedNodes != 1 {
					t.Errorf("publish stats = %+v, want one recorded attempt, no violation, max 1 node", st)
				}
			},
		},
		{
			name: "publish: single-node reader-only already published to node-a, publish to node-b → FailedPrecondition",
			setup: func(t *testing.T, e *env) {
				e.seed(t, "vol-1")
				e.mustPublish(t, "vol-1", "node-a", snro)
			},
			call: func(ctx context.Context, e *env) error {
				_, err := e.ctrl.ControllerPublishVolume(ctx, pubReq("vol-1", "node-b", snro))
				return err
			},
			want: codes.FailedPrecondition,
		},
		{
			name: "publish: single-node single-writer already published to node-a, publish to node-b → FailedPrecondition",
			setup: func(t *testing.T, e *env) {
				e.seed(t, "vol-1")
				e.mustPublish(t, "vol-1", "node-a", snsw)
			},
			call: func(ctx context.Context, e *env) error {
				_, err := e.ctrl.ControllerPublishVolume(ctx, pubReq("vol-1", "node-b", snsw))
				return err
			},
			want: codes.FailedPrecondition,
		},
		{
			name: "publish: single-node multi-writer already published to node-a, publish to node-b → FailedPrecondition",
			setup: func(t *testing.T, e *env) {
				e.seed(t, "vol-1")
				e.mustPublish(t, "vol-1", "node-a", snmw)
			},
			call: func(ctx context.Context, e *env) error {
				_, err := e.ctrl.ControllerPublishVolume(ctx, pubReq("vol-1", "node-b", snmw))
				return err
			},
			want: codes.FailedPrecondition,
		},
		{
			name: "publish: multi-node request while a single-node publication holds node-a → FailedPrecondition",
			setup: func(t *testing.T, e *env) {
				e.seed(t, "vol-1")
				e.mustPublish(t, "vol-1", "node-a", snw)
			},
			call: func(ctx context.Context, e *env) error {
				_, err := e.ctrl.ControllerPublishVolume(ctx, pubReq("vol-1", "node-b", mnmw))
				return err
			},
			want: codes.FailedPrecondition,
		},
		{
			name: "publish: multi-node multi-writer published to node-a, publish to node-b → OK",
			setup: func(t *testing.T, e *env) {
				e.seed(t, "vol-1")
				e.mustPublish(t, "vol-1", "node-a", mnmw)
			},
			call: func(ctx context.Context, e *env) error {
				_, err := e.ctrl.ControllerPublishVolume(ctx, pubReq("vol-1", "node-b", mnmw))
				return err
			},
			want:  codes.OK,
			check: func(t *testing.T, e *env) { wantNodes(t, e, "vol-1", "node-a", "node-b") },
		},
		{
			name: "publish: single-node check skipped, second node → OK and the violation is recorded",
			cfg:  func(c *Config) { c.SkipSingleNodeCheck = true },
			setup: func(t *testing.T, e *env) {
				e.seed(t, "vol-1")
				e.mustPublish(t, "vol-1", "node-a", snw)
			},
			call: func(ctx context.Context, e *env) error {
				_, err := e.ctrl.ControllerPublishVolume(ctx, pubReq("vol-1", "node-b", snw))
				return err
			},
			want: codes.OK,
			check: func(t *testing.T, e *env) {
				st := e.d.Stats().Publish
				want := []SingleNodeEvent{{VolumeID: "vol-1", NodeID: "node-b", OtherNodes: []string{"node-a"}}}
				if !reflect.DeepEqual(st.SingleNodeViolations, want) || st.MaxSingleNodePublishedNodes != 2 {
					t.Errorf("publish stats = %+v, want the violation on node-b and max 2 nodes", st)
				}
			},
		},
		{
			name: "publish: node already at its attach limit → ResourceExhausted",
			cfg:  func(c *Config) { c.MaxVolumesPerNode = 2 },
			setup: func(t *testing.T, e *env) {
				e.seed(t, "vol-1", "vol-2", "vol-3")
				e.mustPublish(t, "vol-1", "node-a", snw)
				e.mustPublish(t, "vol-2", "node-a", snw)
			},
			call: func(ctx context.Context, e *env) error {
				_, err := e.ctrl.ControllerPublishVolume(ctx, pubReq("vol-3", "node-a", snw))
				return err
			},
			want: codes.ResourceExhausted,
		},
		{
			name: "publish: idempotent repeat on a node at its attach limit → OK",
			cfg:  func(c *Config) { c.MaxVolumesPerNode = 1 },
			setup: func(t *testing.T, e *env) {
				e.seed(t, "vol-1")
				e.mustPublish(t, "vol-1", "node-a", snw)
			},
			call: func(ctx context.Context, e *env) error {
				_, err := e.ctrl.ControllerPublishVolume(ctx, pubReq("vol-1", "node-a", snw))
				return err
			},
			want: codes.OK,
		},
		{
			name: "publish: attach limit frees up after unpublish → OK",
			cfg:  func(c *Config) { c.MaxVolumesPerNode = 1 },
			setup: func(t *testing.T, e *env) {
				e.seed(t, "vol-1", "vol-2")
				e.mustPublish(t, "vol-1", "node-a", snw)
				if _, err := e.ctrl.ControllerUnpublishVolume(testCtx(t), &csi.ControllerUnpublishVolumeRequest{VolumeId: "vol-1", NodeId: "node-a"}); err != nil {
					t.Fatal(err)
				}
			},
			call: func(ctx context.Context, e *env) error {
				_, err := e.ctrl.ControllerPublishVolume(ctx, pubReq("vol-2", "node-a", snw))
				return err
			},
			want: codes.OK,
		},
		{
			name:  "publish: readonly without the PUBLISH_READONLY capability → InvalidArgument",
			cfg:   func(c *Config) { c.Capabilities.PublishReadonly = false },
			setup: func(t *testing.T, e *env) { e.seed(t, "vol-1") },
			call: func(ctx context.Context, e *env) error {
				r := pubReq("vol-1", "node-a", snw)
				r.Readonly = true
				_, err := e.ctrl.ControllerPublishVolume(ctx, r)
				return err
			},
			want: codes.InvalidArgument,
		},
		{
			name:  "publish: SINGLE_NODE_MULTI_WRITER mode without the capability → InvalidArgument",
			cfg:   func(c *Config) { c.Capabilities.SingleNodeMultiWriter = false },
			setup: func(t *testing.T, e *env) { e.seed(t, "vol-1") },
			call: func(ctx context.Context, e *env) error {
				_, err := e.ctrl.ControllerPublishVolume(ctx, pubReq("vol-1", "node-a", snmw))
				return err
			},
			want: codes.InvalidArgument,
		},
		{
			name:  "publish: PUBLISH_UNPUBLISH_VOLUME disabled → Unimplemented",
			cfg:   func(c *Config) { c.Capabilities.PublishUnpublishVolume = false },
			setup: func(t *testing.T, e *env) { e.seed(t, "vol-1") },
			call: func(ctx context.Context, e *env) error {
				_, err := e.ctrl.ControllerPublishVolume(ctx, pubReq("vol-1", "node-a", snw))
				return err
			},
			want: codes.Unimplemented,
		},
	})
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
		VolumeCapabilities: []*csi.VolumeCapability{mountCap(snw)},
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
