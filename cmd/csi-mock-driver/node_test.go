package main

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/latchcsi/latch/internal/testsupport"
)

// TestRunServesNodeEndpoints: --node-endpoint serves a node plugin per
// node (its own node ID, its own socket), with the kubelet
// plugin-registration socket in the given directory; /calls?endpoint=
// shows one node's calls; everything is removed at exit.
func TestRunServesNodeEndpoints(t *testing.T) {
	dir := testsupport.SocketDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sock := func(name string) string { return filepath.Join(dir, name) }
	regDir := filepath.Join(dir, "kubelet-a", "plugins_registry")
	httpAddr, stop := startRun(t, ctx,
		"--csi-address="+sock("csi.sock"),
		"--http-endpoint=127.0.0.1:0",
		"--driver-name=test.csi.latch.dev",
		"--node-service=false",
		"--node-endpoint=node-id=mock-a,socket="+sock("a.sock")+",registration-dir="+regDir,
		"--node-endpoint=node-id=mock-b,socket="+sock("b.sock"),
	)

	for node, s := range map[string]string{"mock-a": sock("a.sock"), "mock-b": sock("b.sock")} {
		info, err := csi.NewNodeClient(dialUnix(t, s)).NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
		if err != nil || info.GetNodeId() != node {
			t.Fatalf("NodeGetInfo on %s = %v, %v; want %s", s, info, err, node)
		}
	}
	reg := filepath.Join(regDir, "test.csi.latch.dev-reg.sock")
	pi, err := registerapi.NewRegistrationClient(dialUnix(t, reg)).GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil || pi.GetEndpoint() != sock("a.sock") || pi.GetName() != "test.csi.latch.dev" || pi.GetType() != registerapi.CSIPlugin {
		t.Fatalf("GetInfo on %s = %v, %v", reg, pi, err)
	}

	var calls []struct{ Method, NodeID, Endpoint string }
	getJSON(t, "http://"+httpAddr+"/calls?endpoint=mock-b", &calls)
	if len(calls) != 1 || calls[0].Method != "NodeGetInfo" || calls[0].NodeID != "mock-b" || calls[0].Endpoint != "mock-b" {
		t.Fatalf("GET /calls?endpoint=mock-b = %+v; want mock-b's one NodeGetInfo", calls)
	}

	if code := stop(); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	for _, p := range []string{sock("csi.sock"), sock("a.sock"), sock("b.sock"), reg} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left behind: %v", p, err)
		}
	}
}

func TestParseNodeEndpoint(t *testing.T) {
	o, err := parseFlags([]string{"--node-endpoint=node-id=n1,socket=/s/n1.sock,registration-dir=/k/plugins_registry"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(o.nodes) != 1 || o.nodes[0].NodeID != "n1" || o.nodes[0].Socket != "/s/n1.sock" || o.nodes[0].RegistrationDir != "/k/plugins_registry" {
		t.Fatalf("parsed %+v", o.nodes)
	}
	for _, bad := range []string{"node-id=n1", "socket=/s", "node-id=n1,socket=/s,colour=red", "node-id=n1,socket"} {
		if _, err := parseFlags([]string{"--node-endpoint=" + bad}, io.Discard); err == nil {
			t.Errorf("accepted --node-endpoint=%s", bad)
		}
	}
}
