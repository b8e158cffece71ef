package csimock

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/latchcsi/latch/internal/csi/csitest"
	"github.com/latchcsi/latch/internal/testsupport"
)

// nodeSide is one node endpoint with clients for it.
type nodeSide struct {
	ep    *NodeEndpoint
	node  csi.NodeClient
	dir   string
	stage string
}

// startNode serves a node endpoint for id from e's driver (registration
// in dir/plugins_registry when reg).
func (e *env) startNode(t *testing.T, id string, reg bool) *nodeSide {
	t.Helper()
	dir := testsupport.SocketDir(t)
	c := NodeConfig{NodeID: id, Socket: filepath.Join(dir, "node.sock")}
	if reg {
		c.RegistrationDir = filepath.Join(dir, "plugins_registry")
	}
	ep, err := e.d.StartNode(testCtx(t), c)
	if err != nil {
		t.Fatalf("StartNode(%s): %v", id, err)
	}
	t.Cleanup(ep.Stop)
	return &nodeSide{ep: ep, node: csi.NewNodeClient(dial(t, ep.Endpoint())), dir: dir, stage: filepath.Join(dir, "staging")}
}

func dial(t *testing.T, sock string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial %s: %v", sock, err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func (n *nodeSide) stageReq(vol string) *csi.NodeStageVolumeRequest {
	return &csi.NodeStageVolumeRequest{VolumeId: vol, StagingTargetPath: n.stage,
		VolumeCapability: csitest.Mount(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER, "")}
}

func (n *nodeSide) publishReq(vol, target string) *csi.NodePublishVolumeRequest {
	return &csi.NodePublishVolumeRequest{VolumeId: vol, StagingTargetPath: n.stage, TargetPath: filepath.Join(n.dir, target),
		VolumeCapability: csitest.Mount(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER, "")}
}

// TestNodeEndpointsShareTheStore: each node's endpoint reports its own
// node ID, stages only what the controller published to that node, keeps
// its own staged/published volumes, and its calls are logged with the
// node they reached.
func TestNodeEndpointsShareTheStore(t *testing.T) {
	e := newEnv(t, DefaultConfig())
	e.seed(t, "vol-1")
	a, b := e.startNode(t, "node-a", false), e.startNode(t, "node-b", false)
	ctx := testCtx(t)

	for _, n := range []*nodeSide{a, b} {
		info, err := n.node.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
		if err != nil || info.GetNodeId() != n.ep.NodeID() {
			t.Fatalf("NodeGetInfo on %s = %v, %v; want node ID %s", n.ep.NodeID(), info, err, n.ep.NodeID())
		}
		caps, err := n.node.NodeGetCapabilities(ctx, &csi.NodeGetCapabilitiesRequest{})
		if err != nil || caps.GetCapabilities()[0].GetRpc().GetType() != csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME {
			t.Fatalf("NodeGetCapabilities on %s = %v, %v; want STAGE_UNSTAGE_VOLUME first", n.ep.NodeID(), caps, err)
		}
	}

	_, err := a.node.NodeStageVolume(ctx, a.stageReq("vol-1"))
	wantCode(t, err, codes.FailedPrecondition) // not published anywhere yet
	e.mustPublish(t, "vol-1", "node-a", csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)
	_, err = b.node.NodeStageVolume(ctx, b.stageReq("vol-1"))
	wantCode(t, err, codes.FailedPrecondition) // published to node-a only
	if !strings.Contains(err.Error(), `node "node-b"`) {
		t.Errorf("error %q does not name node-b", err)
	}
	if _, err := a.node.NodeStageVolume(ctx, a.stageReq("vol-1")); err != nil {
		t.Fatalf("stage on node-a: %v", err)
	}
	if _, err := a.node.NodePublishVolume(ctx, a.publishReq("vol-1", "pod1")); err != nil {
		t.Fatalf("publish on node-a: %v", err)
	}
	_, err = a.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: "vol-1", StagingTargetPath: a.stage})
	wantCode(t, err, codes.FailedPrecondition) // still published

	want := NodeVolumes{Staged: map[string]string{"vol-1": a.stage}, Published: map[string][]string{"vol-1": {filepath.Join(a.dir, "pod1")}}}
	if got := e.d.NodeVolumes("node-a"); !reflect.DeepEqual(got, want) {
		t.Errorf("node-a volumes = %+v, want %+v", got, want)
	}
	if got := e.d.State().Nodes; !reflect.DeepEqual(got, map[string]NodeVolumes{"node-a": want}) {
		t.Errorf("State().Nodes = %+v, want only node-a's %+v", got, want)
	}

	var methods []string
	for _, c := range e.d.NodeCalls("node-b") {
		if c.NodeID != "node-b" && strings.HasPrefix(c.Method, "Node") {
			t.Errorf("call %s on node-b's socket logged with node ID %q", c.Method, c.NodeID)
		}
		methods = append(methods, c.Method+"/"+c.CodeName)
	}
	if want := []string{"NodeGetInfo/OK", "NodeGetCapabilities/OK", "NodeStageVolume/FailedPrecondition"}; !reflect.DeepEqual(methods, want) {
		t.Errorf("node-b's calls = %v, want %v", methods, want)
	}
	if calls := e.d.CallsTo("ControllerPublishVolume"); len(calls) != 1 || calls[0].Endpoint != "" {
		t.Errorf("controller calls = %+v, want one on the driver's own socket (no endpoint)", calls)
	}
}

// TestNodeFaultsByNode: a rule with a node ID acts on that node's Node
// calls only; before (fail, hang) and after ("late": the volume is staged
// but the caller sees the error) phases both work per node.
func TestNodeFaultsByNode(t *testing.T) {
	e := newEnv(t, DefaultConfig())
	e.seed(t, "vol-1")
	a, b := e.startNode(t, "node-a", false), e.startNode(t, "node-b", false)
	for _, n := range []string{"node-a", "node-b"} {
		e.mustPublish(t, "vol-1", n, csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)
	}
	ctx := testCtx(t)
	if _, err := e.d.AddFault(Rule{ID: "fail-a", Method: "NodeStageVolume", NodeID: "node-a", Code: codes.Internal, Once: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.node.NodeStageVolume(ctx, b.stageReq("vol-1")); err != nil {
		t.Fatalf("stage on node-b with a rule for node-a: %v", err)
	}
	_, err := a.node.NodeStageVolume(ctx, a.stageReq("vol-1"))
	wantCode(t, err, codes.Internal)
	if st := e.d.NodeVolumes("node-a"); len(st.Staged) != 0 {
		t.Fatalf("a failed (before-phase) stage left state: %+v", st)
	}

	if _, err := e.d.AddFault(Rule{ID: "late-a", Method: "NodeStageVolume", NodeID: "node-a", Phase: PhaseAfter, Code: codes.DeadlineExceeded, Once: true}); err != nil {
		t.Fatal(err)
	}
	_, err = a.node.NodeStageVolume(ctx, a.stageReq("vol-1"))
	wantCode(t, err, codes.DeadlineExceeded)
	if st := e.d.NodeVolumes("node-a"); st.Staged["vol-1"] != a.stage {
		t.Fatalf("a late fault must leave the volume staged, got %+v", st)
	}
	if _, err := a.node.NodeStageVolume(ctx, a.stageReq("vol-1")); err != nil {
		t.Fatalf("stage again after the late fault (idempotent): %v", err)
	}

	if _, err := e.d.AddFault(Rule{ID: "hang-b", Method: "NodePublishVolume", NodeID: "node-b", Hang: true}); err != nil {
		t.Fatal(err)
	}
	hctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = b.node.NodePublishVolume(hctx, b.publishReq("vol-1", "pod"))
	wantCode(t, err, codes.DeadlineExceeded)
	if time.Since(start) < 250*time.Millisecond {
		t.Errorf("hung publish returned after %s, before the caller gave up", time.Since(start))
	}
	if _, err := a.node.NodePublishVolume(ctx, a.publishReq("vol-1", "pod")); err != nil {
		t.Fatalf("publish on node-a with a hang for node-b: %v", err)
	}
	for _, f := range e.d.Faults() {
		want := map[string]int64{"fail-a": 1, "late-a": 1, "hang-b": 1}[f.ID]
		if f.Fired != want {
			t.Errorf("rule %s fired %d times, want %d", f.ID, f.Fired, want)
		}
	}
}

// TestNodeRegistration: the endpoint serves the kubelet's plugin
// registration service on <plugins_registry>/<driver>-reg.sock and records
// what the kubelet reports; Stop removes both sockets and keeps the node's
// state for the next endpoint of the node.
func TestNodeRegistration(t *testing.T) {
	e := newEnv(t, DefaultConfig())
	e.seed(t, "vol-1")
	n := e.startNode(t, "node-a", true)
	ctx := testCtx(t)
	wantReg := filepath.Join(n.dir, "plugins_registry", e.d.Config().Name+"-reg.sock")
	if n.ep.RegistrationSocket() != wantReg {
		t.Fatalf("registration socket %q, want %q", n.ep.RegistrationSocket(), wantReg)
	}
	reg := registerapi.NewRegistrationClient(dial(t, wantReg))
	info, err := reg.GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.GetType() != registerapi.CSIPlugin || info.GetName() != e.d.Config().Name || info.GetEndpoint() != n.ep.Endpoint() ||
		!reflect.DeepEqual(info.GetSupportedVersions(), []string{"1.0.0"}) {
		t.Errorf("GetInfo = %v", info)
	}
	if _, err := reg.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{Error: "driver name taken"}); err != nil {
		t.Fatal(err)
	}
	if got, want := n.ep.Registration(), (RegistrationStatus{InfoCalls: 1, Notified: true, Error: "driver name taken"}); got != want {
		t.Errorf("Registration() = %+v, want %+v", got, want)
	}

	if _, err := e.d.StartNode(ctx, NodeConfig{NodeID: "node-a", Socket: filepath.Join(n.dir, "other.sock")}); err == nil {
		t.Fatal("a second endpoint for a node that has one running was accepted")
	}
	e.mustPublish(t, "vol-1", "node-a", csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	req := n.stageReq("vol-1")
	req.VolumeCapability = csitest.Mount(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "")
	if _, err := n.node.NodeStageVolume(ctx, req); err != nil {
		t.Fatal(err)
	}
	n.ep.Stop()
	for _, p := range []string{n.ep.Endpoint(), wantReg} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s still there after Stop: %v", p, err)
		}
	}
	if got := e.d.NodeEndpoints(); len(got) != 0 {
		t.Errorf("endpoints after Stop: %v", got)
	}
	again, err := e.d.StartNode(ctx, NodeConfig{NodeID: "node-a", Socket: n.ep.Endpoint()})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Stop()
	if st := e.d.NodeVolumes("node-a"); st.Staged["vol-1"] != n.stage {
		t.Errorf("staged volume lost across the endpoint's restart: %+v", st)
	}
}

// TestNodeEndpointRefusesNonSocket: a file in the socket's place is
// neither replaced nor removed.
func TestNodeEndpointRefusesNonSocket(t *testing.T) {
	e := newEnv(t, DefaultConfig())
	path := filepath.Join(testsupport.SocketDir(t), "node.sock")
	if err := os.WriteFile(path, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := e.d.StartNode(testCtx(t), NodeConfig{NodeID: "node-a", Socket: path})
	if err == nil || !strings.Contains(err.Error(), "node-a") || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("StartNode over a regular file: %v, want an error naming the node and the cause", err)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "keep" {
		t.Errorf("the file was touched: %q, %v", b, err)
	}
	if _, err := e.d.StartNode(testCtx(t), NodeConfig{NodeID: "node-a", Socket: filepath.Join(filepath.Dir(path), "ok.sock")}); err != nil {
		t.Errorf("a failed start must not leave the node marked as running: %v", err)
	}
}
