package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// startRun runs the binary's run with args (output discarded) and returns
// once it serves: its HTTP address, and stop, which ends run and returns
// its exit code. Ending ctx ends run too.
func startRun(t *testing.T, ctx context.Context, args ...string) (httpAddr string, stop func() int) {
	t.Helper()
	runCtx, cancel := context.WithCancel(ctx)
	addrc, exit := make(chan string, 1), make(chan int, 1)
	go func() {
		exit <- run(runCtx, args, io.Discard, func(addr string) { addrc <- addr })
	}()
	select {
	case httpAddr = <-addrc:
	case code := <-exit:
		cancel()
		t.Fatalf("run exited early with %d", code)
	}
	return httpAddr, func() int {
		cancel()
		return <-exit
	}
}

// getJSON decodes the JSON body of GET url into v.
func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}

// dialUnix is a gRPC client of the unix socket sock, closed when the test
// ends.
func dialUnix(t *testing.T, sock string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}
