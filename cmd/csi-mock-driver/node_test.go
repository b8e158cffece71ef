package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// TestRunServesNodeEndpoints: --node-endpoint serves a node plugin per
// node (its own node ID, its own socket), with the kubelet
// plugin-registration socket in the given directory; /calls?endpoint=
// shows one node's calls; everything is removed at exit.
func TestRunServesNodeEndpoints(t *testing.T) {
	dir, err := os.MkdirTemp("", "csimocknode")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	runCtx, stop := context.WithCancel(ctx)
	addrc, exit := make(chan string, 1), make(chan int, 1)
	sock := func(name string) string { return filepath.Join(dir, name) }
	regDir := filepath.Join(dir, "kubelet-a", "plugins_registry")
	go func() {
		exit <- run(runCtx, []string{
			"--csi-address=" + sock("csi.sock"),
			"--http-endpoint=127.0.0.1:0",
			"--driver-name=test.csi.latch.dev",
			"--node-service=false",
			"--node-endpoint=node-id=mock-a,socket=" + sock("a.sock") + ",registration-dir=" + regDir,
			"--node-endpoint=node-id=mock-b,socket=" + sock("b.sock"),
		}, io.Discard, func(addr string) { addrc <- addr })
	}()
	var httpAddr string
	select {
	case httpAddr = <-addrc:
	case code := <-exit:
		t.Fatalf("run exited early with %d", code)
	}

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

	resp, err := http.Get("http://" + httpAddr + "/calls?endpoint=mock-b")
	if err != nil {
		t.Fatal(err)
	}
	var calls []struct{ Method, NodeID, Endpoint string }
	err = json.NewDecoder(resp.Body).Decode(&calls)
	resp.Body.Close()
	if err != nil || len(calls) != 1 || calls[0].Method != "NodeGetInfo" || calls[0].NodeID != "mock-b" || calls[0].Endpoint != "mock-b" {
		t.Fatalf("GET /calls?endpoint=mock-b = %+v, %v; want mock-b's one NodeGetInfo", calls, err)
	}

	stop()
	if code := <-exit; code != 0 {
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

func dialUnix(t *testing.T, sock string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}
