package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

// port is the port of a host:port address.
func port(t *testing.T, addr string) string {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// checkMetricsEndpoints: each metrics endpoint serves its controller's
// metrics and not the other's (nor the API server's, which runs in the same
// process): csi-attacher its attach latency and its queues, the controller
// its volume totals, its queues and its Lease.
func checkMetricsEndpoints(t *testing.T, ctx context.Context, attacher, controller string) {
	t.Helper()
	for _, c := range []struct {
		name, addr    string
		want, wantNot []string
	}{
		{"csi-attacher", attacher,
			[]string{"latch_attacher_attach_latency_seconds_count", `workqueue_adds_total{name="csi-attacher-va"}`, "csi_sidecar_operations_seconds_count", "rest_client_requests_total"},
			[]string{"attachdetach_controller_total_volumes", `name="attachdetach_`, "apiserver_request_total"}},
		{"attachdetach-controller", controller,
			[]string{"attachdetach_controller_total_volumes", `workqueue_adds_total{name="attachdetach_pods"}`, `leader_election_master_status{name="latch-attachdetach-controller"} 1`, "rest_client_requests_total"},
			[]string{"latch_attacher_", `name="csi-attacher-`, "apiserver_request_total"}},
	} {
		url := "http://" + c.addr + "/metrics"
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Errorf("%s metrics: %v", c.name, err)
			continue
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Errorf("%s metrics: %s, %v", c.name, resp.Status, err)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(string(body), w) {
				t.Errorf("%s metrics at %s lack %s", c.name, url, w)
			}
		}
		for _, w := range c.wantNot {
			if strings.Contains(string(body), w) {
				t.Errorf("%s metrics at %s carry %s, which is not its own", c.name, url, w)
			}
		}
	}
}

// checkMetricsPrinted: `up` printed both metrics URLs.
func checkMetricsPrinted(t *testing.T, printed, attacher, controller string) {
	t.Helper()
	for _, line := range []string{"  csi-attacher             http://" + attacher + "/metrics\n", "  attachdetach-controller  http://" + controller + "/metrics\n"} {
		if !strings.Contains(printed, line) {
			t.Errorf("up does not print the line %q:\n%s", line, printed)
		}
	}
}
