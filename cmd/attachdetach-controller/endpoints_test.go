package main

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/latchcsi/latch/internal/testsupport"
)

// The tests start the real process: the test binary run as the command.
func TestMain(m *testing.M) { testsupport.RunTestMainAsCommand(m, main) }

// lastLines is the end of a process's output, for failure messages.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// get returns the status code and body of GET url, or 0 when nothing answers.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	client := &http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// The Deployments probe --health-endpoint, which serves /healthz and
// /healthz/leader-election and no metrics, so it can listen on the Pod's
// interfaces for the kubelet while --http-endpoint (metrics) stays on
// loopback. The API server here is unreachable: health and metrics are
// served before the controller needs it, as on a cold start.
func TestRun_healthEndpointServesProbesButNoMetrics(t *testing.T) {
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	// Port 1 on loopback: connections are refused at once.
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	health, metrics := testsupport.FreeAddr(t), testsupport.FreeAddr(t)
	// A process of its own: logging configuration and the legacy metrics
	// registry are per process, as in the real binary.
	cmd := testsupport.Command("--kubeconfig="+kubeconfig, "--leader-elect-resource-namespace=default",
		"--health-endpoint="+health, "--http-endpoint="+metrics)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan int, 1)
	go func() {
		_ = cmd.Wait()
		done <- cmd.ProcessState.ExitCode()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})

	deadline := time.Now().Add(10 * time.Second)
	for {
		if code, _ := get(t, "http://"+health+"/healthz"); code == http.StatusOK {
			break
		}
		select {
		case c := <-done:
			done <- c
			t.Fatalf("exited with %d before serving health:\n%s", c, lastLines(stderr.String(), 20))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("--health-endpoint %s never answered /healthz", health)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if code, body := get(t, "http://"+health+"/healthz/leader-election"); code != http.StatusOK {
		t.Errorf("GET %s/healthz/leader-election = %d %s, want 200 (a candidate is healthy)", health, code, body)
	}
	if code, body := get(t, "http://"+health+"/metrics"); code != http.StatusNotFound {
		t.Errorf("GET %s/metrics = %d, want 404: the health endpoint must not serve metrics\n%.300s", health, code, body)
	}
	// Metrics (and, as before, health) on --http-endpoint.
	code, body := get(t, "http://"+metrics+"/metrics")
	if code != http.StatusOK || !strings.Contains(body, "# TYPE") {
		t.Errorf("GET %s/metrics = %d, want 200 with metrics\n%.300s", metrics, code, body)
	}
	if code, _ := get(t, "http://"+metrics+"/healthz"); code != http.StatusOK {
		t.Errorf("GET %s/healthz = %d, want 200 (--http-endpoint keeps its health paths)", metrics, code)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-done:
		done <- c // for the cleanup
		if c != 0 {
			t.Errorf("exit code %d after SIGTERM, want 0; stderr:\n%s", c, lastLines(stderr.String(), 20))
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the controller did not exit after SIGTERM")
	}
}

func TestParseOptions_healthEndpoint(t *testing.T) {
	o, err := parseOptions([]string{"--health-endpoint=:8081", "--http-endpoint=127.0.0.1:8080"})
	if err != nil {
		t.Fatal(err)
	}
	if o.healthEndpoint != ":8081" || o.httpEndpoint != "127.0.0.1:8080" {
		t.Errorf("health %q http %q, want :8081 and 127.0.0.1:8080", o.healthEndpoint, o.httpEndpoint)
	}
	// One address cannot be both: the second listen would fail.
	_, err = parseOptions([]string{"--health-endpoint=:8080", "--http-endpoint=:8080"})
	if err == nil || !strings.Contains(err.Error(), "--health-endpoint") || !strings.Contains(err.Error(), "--http-endpoint") || !strings.Contains(err.Error(), ":8080") {
		t.Errorf("same address twice: error %v, want one naming both flags and the address", err)
	}
}
