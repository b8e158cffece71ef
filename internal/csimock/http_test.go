package csimock

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/latchcsi/latch/internal/csi/csitest"
)

func TestHTTPHandler(t *testing.T) {
	e := newEnv(t, DefaultConfig())
	e.seed(t, "vol-1")
	srv := httptest.NewServer(e.d.HTTPHandler())
	defer srv.Close()

	do := func(method, path, body string, wantStatus int, out any) {
		t.Helper()
		req, err := http.NewRequestWithContext(testCtx(t), method, srv.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != wantStatus {
			t.Fatalf("%s %s: status %d, want %d", method, path, resp.StatusCode, wantStatus)
		}
		if out != nil {
			if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
				t.Fatalf("%s %s: decode: %v", method, path, err)
			}
		}
	}

	var added struct{ IDs []string }
	do("POST", "/faults", "method: ControllerPublishVolume\nnodeID: node-b\ncode: ResourceExhausted\n", http.StatusCreated, &added)
	if len(added.IDs) != 1 {
		t.Fatalf("added %v", added.IDs)
	}
	do("POST", "/faults", `{"rules": [{"method": "Probe", "latency": "1ms"}]}`, http.StatusCreated, nil)
	do("POST", "/faults", `[{"method": "Nope", "code": "Internal"}]`, http.StatusBadRequest, nil)

	e.mustPublish(t, "vol-1", "node-a", csitest.MNRO)
	_, err := e.ctrl.ControllerPublishVolume(testCtx(t), pubReq("vol-1", "node-b", csitest.MNRO))
	wantCode(t, err, codes.ResourceExhausted)

	var faults []map[string]any
	do("GET", "/faults", "", http.StatusOK, &faults)
	if len(faults) != 2 || faults[0]["fired"] != float64(1) || faults[0]["code"] != "ResourceExhausted" {
		t.Fatalf("GET /faults = %v", faults)
	}
	do("DELETE", "/faults/"+added.IDs[0], "", http.StatusNoContent, nil)
	do("DELETE", "/faults/"+added.IDs[0], "", http.StatusNotFound, nil)
	e.mustPublish(t, "vol-1", "node-b", csitest.MNRO)

	var calls []map[string]any
	do("GET", "/calls?method=ControllerPublishVolume", "", http.StatusOK, &calls)
	if len(calls) != 3 || calls[1]["code"] != "ResourceExhausted" || calls[1]["nodeID"] != "node-b" {
		t.Fatalf("GET /calls = %v", calls)
	}
	var stats Stats
	do("GET", "/stats", "", http.StatusOK, &stats)
	if stats.Methods["ControllerPublishVolume"].Calls != 3 || stats.Methods["ControllerPublishVolume"].ByCode["OK"] != 2 {
		t.Fatalf("GET /stats = %+v", stats)
	}
	var state State
	do("GET", "/state", "", http.StatusOK, &state)
	if len(state.Volumes) != 1 || len(state.Volumes[0].Published) != 2 || state.Volumes[0].Published[0].PublishContext["devicePath"] == "" {
		t.Fatalf("GET /state = %+v", state)
	}
	do("DELETE", "/faults", "", http.StatusNoContent, nil)

	do("POST", "/ready?ready=false", "", http.StatusNoContent, nil)
	if e.d.Ready() {
		t.Fatal("still ready after POST /ready?ready=false")
	}
	do("POST", "/crash?keepState=true", "", http.StatusNoContent, nil)
	do("POST", "/crash", "", http.StatusConflict, nil)
	do("POST", "/restart", "", http.StatusNoContent, nil)
	if !e.d.Serving() {
		t.Fatal("not serving after POST /restart")
	}
}
