package csimock

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/latchcsi/latch/internal/csi/csitest"
	"github.com/latchcsi/latch/internal/testsupport"
)

// env is a driver serving on a real unix socket plus clients for it.
type env struct {
	d      *Driver
	logger klog.Logger
	sock   string
	conn   *grpc.ClientConn
	ident  csi.IdentityClient
	ctrl   csi.ControllerClient
	node   csi.NodeClient
}

func newEnv(t testing.TB, cfg Config) *env {
	t.Helper()
	d, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	// Buffered so tests can assert what was (not) logged.
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true), ktesting.Verbosity(5)))
	ctx := klog.NewContext(context.Background(), logger)
	sock := filepath.Join(testsupport.SocketDir(t), "csi.sock")
	if err := d.Start(ctx, "unix://"+sock); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(d.Stop)
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	return &env{d: d, logger: logger, sock: sock, conn: conn,
		ident: csi.NewIdentityClient(conn), ctrl: csi.NewControllerClient(conn), node: csi.NewNodeClient(conn)}
}

func testCtx(t testing.TB) context.Context {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func pubReq(vol, node string, mode csi.VolumeCapability_AccessMode_Mode) *csi.ControllerPublishVolumeRequest {
	return &csi.ControllerPublishVolumeRequest{VolumeId: vol, NodeId: node, VolumeCapability: csitest.Mount(mode, "")}
}

func (e *env) seed(t testing.TB, ids ...string) {
	t.Helper()
	for _, id := range ids {
		if err := e.d.SeedVolume(VolumeSpec{ID: id, CapacityBytes: 1 << 30}); err != nil {
			t.Fatalf("SeedVolume(%s): %v", id, err)
		}
	}
}

func (e *env) mustPublish(t testing.TB, vol, node string, mode csi.VolumeCapability_AccessMode_Mode) *csi.ControllerPublishVolumeResponse {
	t.Helper()
	resp, err := e.ctrl.ControllerPublishVolume(testCtx(t), pubReq(vol, node, mode))
	if err != nil {
		t.Fatalf("publish %s to %s: %v", vol, node, err)
	}
	return resp
}

func wantCode(t testing.TB, err error, want codes.Code) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Fatalf("got code %s (%v), want %s", got, err, want)
	}
}
