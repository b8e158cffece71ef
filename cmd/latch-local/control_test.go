package main

import (
	"bytes"
	"io"
	"path/filepath"
	"strings"
	"testing"
)

// --upstream is a mode of up, with real nodes only; the demo refuses it.
func TestUpstreamFlagIsAModeOfUpWithRealNodes(t *testing.T) {
	c, _, err := parse([]string{"up", "--upstream"}, io.Discard)
	if err != nil || !c.opts.Upstream || !c.opts.RealNodes {
		t.Fatalf("up --upstream: %+v, %v; want upstream mode with real nodes", c, err)
	}
	if c, _, err = parse([]string{"up"}, io.Discard); err != nil || c.opts.Upstream {
		t.Errorf("up: upstream mode %v, err %v; want latch's controllers", c.opts.Upstream, err)
	}
	for _, args := range [][]string{{"demo", "--upstream"}, {"up", "--upstream", "--real-nodes=false"}} {
		var stdout, stderr bytes.Buffer
		if code := run(args, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), "--upstream") {
			t.Errorf("run(%q) = %d, stderr %q; want 2 and an error naming --upstream", args, code, stderr.String())
		}
	}
}

// start, stop and restart need a component, and a kubeconfig of a
// running latch-local: without one they say so and exit 1, before any
// request is sent.
func TestControlCommandsNeedAComponentAndLatchLocalsKubeconfig(t *testing.T) {
	for _, args := range [][]string{{"start"}, {"stop", "--kubeconfig", "x"}, {"restart"}} {
		var stdout, stderr bytes.Buffer
		if code := run(args, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), "latch-local stop external-attacher|csi-attacher|attachdetach-controller") {
			t.Errorf("run(%q) = %d, stderr %q; want 2 and the commands' usage", args, code, stderr.String())
		}
	}
	missing := filepath.Join(t.TempDir(), "latch-local.kubeconfig")
	for _, args := range [][]string{{"start", "csi-attacher", "--kubeconfig", missing}, {"stop", "--kubeconfig=" + missing, "external-attacher"}} {
		var stdout, stderr bytes.Buffer
		if code := run(args, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), missing) || !strings.Contains(stderr.String(), "start latch-local up --upstream first") {
			t.Errorf("run(%q) = %d, stderr %q; want 1 and an error naming the kubeconfig and what to do", args, code, stderr.String())
		}
	}
}
