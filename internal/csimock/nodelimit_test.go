package csimock

import (
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/latchcsi/latch/internal/csi/csitest"
	"github.com/latchcsi/latch/internal/testsupport"
)

// TestNodeMaxVolumes: a node endpoint's MaxVolumes is what its NodeGetInfo
// reports and the attach limit ControllerPublish enforces for that node
// only; other nodes keep the driver-wide limit (here none, reported as 0).
func TestNodeMaxVolumes(t *testing.T) {
	e := newEnv(t, DefaultConfig())
	e.seed(t, "vol-1", "vol-2", "vol-3", "vol-4")
	ctx := testCtx(t)
	dir := testsupport.SocketDir(t)
	limited, err := e.d.StartNode(ctx, NodeConfig{NodeID: "node-a", Socket: filepath.Join(dir, "a.sock"), MaxVolumes: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(limited.Stop)
	other := e.startNode(t, "node-b", false)

	info, err := csi.NewNodeClient(dial(t, limited.Endpoint())).NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	if err != nil || info.GetMaxVolumesPerNode() != 1 {
		t.Fatalf("NodeGetInfo on node-a = %v, %v; want max_volumes_per_node 1", info, err)
	}
	if info, err := other.node.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{}); err != nil || info.GetMaxVolumesPerNode() != 0 {
		t.Fatalf("NodeGetInfo on node-b = %v, %v; want max_volumes_per_node 0 (unlimited)", info, err)
	}
	if _, err := e.ctrl.ControllerPublishVolume(ctx, pubReq("vol-1", "node-a", csitest.SNW)); err != nil {
		t.Fatal(err)
	}
	_, err = e.ctrl.ControllerPublishVolume(ctx, pubReq("vol-2", "node-a", csitest.SNW))
	wantCode(t, err, codes.ResourceExhausted)
	for _, v := range []string{"vol-2", "vol-3"} {
		if _, err := e.ctrl.ControllerPublishVolume(ctx, pubReq(v, "node-b", csitest.SNW)); err != nil {
			t.Fatalf("publish %s to node-b: %v", v, err)
		}
	}
	// The limit is the node's, not its endpoint's: it holds after Stop.
	limited.Stop()
	_, err = e.ctrl.ControllerPublishVolume(ctx, pubReq("vol-4", "node-a", csitest.SNW))
	wantCode(t, err, codes.ResourceExhausted)
	if _, err := e.d.StartNode(ctx, NodeConfig{NodeID: "node-c", Socket: filepath.Join(dir, "c.sock"), MaxVolumes: -1}); err == nil {
		t.Fatal("a negative MaxVolumes must be refused")
	}
}

// TestFaultHangReleased: ReleaseHang lets the held calls go on — a hang
// without a code runs the call late (its state change happens then), a
// hang with a code fails with it — and removes the rule, so later calls
// do not hang.
func TestFaultHangReleased(t *testing.T) {
	for _, tc := range []struct {
		name      string
		code      codes.Code
		published bool
	}{
		{"no code: the call runs when released", codes.OK, true},
		{"code: the call fails with it when released", codes.DeadlineExceeded, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, DefaultConfig())
			e.seed(t, "vol-1", "vol-2")
			id, err := e.d.AddFault(Rule{Method: "ControllerPublishVolume", VolumeID: "vol-1", Hang: true, Code: tc.code})
			if err != nil {
				t.Fatal(err)
			}
			errc := make(chan error, 1)
			go func() {
				_, err := e.ctrl.ControllerPublishVolume(testCtx(t), pubReq("vol-1", "node-a", csitest.SNW))
				errc <- err
			}()
			eventually(t, "the publish to hang", func() bool { return inFlight(e.d, "ControllerPublishVolume") })
			wantNodes(t, e, "vol-1")
			if !e.d.ReleaseHang(id) {
				t.Fatalf("ReleaseHang(%s) found no rule", id)
			}
			wantCode(t, <-errc, tc.code)
			if tc.published {
				wantNodes(t, e, "vol-1", "node-a")
			} else {
				wantNodes(t, e, "vol-1")
			}
			if len(e.d.Faults()) != 0 || e.d.ReleaseHang(id) {
				t.Fatalf("rule %s still installed after ReleaseHang: %+v", id, e.d.Faults())
			}
			if _, err := e.ctrl.ControllerPublishVolume(testCtx(t), pubReq("vol-2", "node-a", csitest.SNW)); err != nil {
				t.Fatalf("a later publish: %v", err)
			}
		})
	}
}
