package main

import (
	"bytes"
	"encoding/json"
	"io"
	"maps"
	"strings"
	"testing"

	"github.com/latchcsi/latch/internal/latchlocal"
)

// The README's first command, as a script would run it: `latch-local demo
// --output json` exits 0 and reports every step, in order, as JSON, the
// real kubelet's among them (--real-nodes is the default).
func TestDemoCommandWithJSONOutput(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run([]string{"demo", "--output", "json", "--publish-failures", "1", "--log-file", t.TempDir() + "/latch-local.log"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit code %d, stderr:\n%s", code, stderr.String())
	}
	var r latchlocal.Result
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
		t.Fatalf("stdout is not the JSON result: %v\n%s", err, stdout.String())
	}
	// 22 steps of latch's and the API's, and the real kubelet's
	// NodeStage/NodePublish twice and NodeUnpublish/NodeUnstage once.
	if !r.OK || len(r.Steps) != 28 {
		t.Fatalf("result OK=%v with %d steps, want OK with 28: %+v", r.OK, len(r.Steps), r)
	}
	kubeletSteps := map[string]int{}
	for _, s := range r.Steps {
		if strings.HasPrefix(s.Name, "Node") {
			kubeletSteps[s.Name]++
		}
	}
	if want := map[string]int{"NodeStageVolume succeeded": 2, "NodePublishVolume succeeded": 2, "NodeUnpublishVolume succeeded": 1, "NodeUnstageVolume succeeded": 1}; !maps.Equal(kubeletSteps, want) {
		t.Errorf("the kubelet's steps in the timeline: %v, want %v", kubeletSteps, want)
	}
	if r.Steps[0].Name != "PV and PVC created" || r.Steps[len(r.Steps)-1].Name != "VolumeAttachment deleted" {
		t.Errorf("first/last steps = %q/%q", r.Steps[0].Name, r.Steps[len(r.Steps)-1].Name)
	}
	for i := 1; i < len(r.Steps); i++ {
		if r.Steps[i].At < r.Steps[i-1].At {
			t.Errorf("step %d (%s) observed before step %d", i, r.Steps[i].Name, i-1)
		}
	}
}

func TestUsageErrorsExitTwo(t *testing.T) {
	for _, args := range [][]string{{"bogus"}, {"demo", "--nodes", "1"}, {"demo", "--output", "xml"},
		{"up", "--metrics-ports", "18080"}, {"up", "--metrics-ports", "18080,x"}, {"up", "--metrics-ports", "18080,18080"}, {"up", "--backend", "tape-library"}} {
		var stdout, stderr bytes.Buffer
		if code := run(args, &stdout, &stderr); code != 2 {
			t.Errorf("run(%q) = %d, want 2 (stderr %q)", args, code, stderr.String())
		}
	}
}

// --backend hands a built-in backend profile to latch-local's mock driver.
func TestBackendFlagPicksAProfile(t *testing.T) {
	c, _, err := parse([]string{"up", "--backend", "throttling-api"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if b := c.opts.Backend; b == nil || b.Profile != "throttling-api" || len(b.Phases) != 2 {
		t.Errorf("--backend throttling-api gave %+v", b)
	}
	if c, _, err = parse([]string{"up"}, io.Discard); err != nil || c.opts.Backend != nil {
		t.Errorf("without --backend: backend %+v, err %v; want none", c.opts.Backend, err)
	}
}
