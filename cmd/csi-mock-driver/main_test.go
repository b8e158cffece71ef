package main

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/latchcsi/latch/internal/testsupport"
)

func TestRunServesCSIAndHTTP(t *testing.T) {
	dir := testsupport.SocketDir(t)
	sock := filepath.Join(dir, "csi.sock")
	faults := filepath.Join(dir, "faults.yaml")
	if err := os.WriteFile(faults, []byte("rules:\n- method: ControllerUnpublishVolume\n  code: Unavailable\n  once: true\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	httpAddr, stop := startRun(t, ctx,
		"--csi-address=unix://"+sock,
		"--http-endpoint=127.0.0.1:0",
		"--driver-name=test.csi.latch.dev",
		"--known-nodes=node-a,node-b",
		"--auto-create-volumes",
		"--max-volumes-per-node=5",
		"--fault-config="+faults,
		"--latency=Probe=1ms,GetPluginInfo=1ms",
		"-v=2",
	)

	conn := dialUnix(t, sock)
	info, err := csi.NewIdentityClient(conn).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	if err != nil || info.GetName() != "test.csi.latch.dev" {
		t.Fatalf("GetPluginInfo = %v, %v", info, err)
	}
	ctrl := csi.NewControllerClient(conn)
	capability := &csi.VolumeCapability{
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
	}
	// --known-nodes: node-z does not exist.
	_, err = ctrl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: "vol-1", NodeId: "node-z", VolumeCapability: capability})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("publish to unknown node: %v, want NotFound", err)
	}
	// --auto-create-volumes: vol-1 springs into existence.
	if _, err := ctrl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: "vol-1", NodeId: "node-a", VolumeCapability: capability}); err != nil {
		t.Fatalf("publish: %v", err)
	}
	// --fault-config: the first unpublish fails.
	_, err = ctrl.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: "vol-1", NodeId: "node-a"})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("first unpublish: %v, want Unavailable from the fault file", err)
	}

	var calls []struct{ Method, Code string }
	getJSON(t, "http://"+httpAddr+"/calls", &calls)
	var got []string
	for _, c := range calls {
		got = append(got, c.Method+":"+c.Code)
	}
	want := "GetPluginInfo:OK ControllerPublishVolume:NotFound ControllerPublishVolume:OK ControllerUnpublishVolume:Unavailable"
	if strings.Join(got, " ") != want {
		t.Fatalf("GET /calls = %v, want %s", got, want)
	}
	var rules []map[string]any
	getJSON(t, "http://"+httpAddr+"/faults", &rules)
	if len(rules) != 3 {
		t.Fatalf("GET /faults = %v; want the file's rule and two latency rules", rules)
	}

	if code := stop(); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket left behind: %v", err)
	}
}

func TestParseFlags(t *testing.T) {
	o, err := parseFlags([]string{"--known-nodes=a,b", "--publish-readonly=false", "--latency=ControllerPublishVolume=2s", "--max-volumes-per-node=7"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c := o.driver
	if len(c.KnownNodes) != 2 || c.Capabilities.PublishReadonly || !c.Capabilities.ListVolumes || c.MaxVolumesPerNode != 7 ||
		len(o.latencies) != 1 || o.latencies[0].Latency != 2*time.Second || o.csiAddress != "/run/csi/socket" {
		t.Fatalf("parsed %+v", o)
	}
	for name, args := range map[string][]string{
		"non-loopback http endpoint": {"--http-endpoint=0.0.0.0:8080"},
		"all-interfaces endpoint":    {"--http-endpoint=:8080"},
		"latency without duration":   {"--latency=Probe"},
		"stray argument":             {"extra"},
		"unknown backend profile":    {"--backend=tape-library"},
		"both backend flags":         {"--backend=fast-san", "--backend-file=backend.yaml"},
		"missing backend file":       {"--backend-file=" + filepath.Join(t.TempDir(), "none.yaml")},
	} {
		if _, err := parseFlags(args, io.Discard); err == nil {
			t.Errorf("%s: accepted %v", name, args)
		}
	}
}

// --backend picks a built-in profile; --backend-file describes one.
func TestParseFlagsBackend(t *testing.T) {
	o, err := parseFlags([]string{"--backend=slow-cloud"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if b := o.driver.Backend; b == nil || b.Profile != "slow-cloud" || b.Capacity != 16 || b.Rate != 10 {
		t.Errorf("--backend=slow-cloud gave %+v", b)
	}
	file := filepath.Join(t.TempDir(), "backend.yaml")
	if err := os.WriteFile(file, []byte("latency: 300ms\ncapacity: 5\nrate: 2\nthrottleCode: Unavailable\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	o, err = parseFlags([]string{"--backend-file=" + file}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if b := o.driver.Backend; b == nil || time.Duration(b.Latency) != 300*time.Millisecond || b.Capacity != 5 || b.Rate != 2 || codes.Code(b.ThrottleCode) != codes.Unavailable {
		t.Errorf("--backend-file gave %+v", b)
	}
	if err := os.WriteFile(file, []byte("latency: 300ms\ncapcity: 5\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := parseFlags([]string{"--backend-file=" + file}, io.Discard); err == nil || !strings.Contains(err.Error(), "capcity") {
		t.Errorf("a mistyped field = %v, want an error naming it", err)
	}
}
