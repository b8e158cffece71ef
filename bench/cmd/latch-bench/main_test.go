package main

import (
	"strings"
	"testing"
)

func TestParseTakesComponentFlagsAndRefusesThemInProcess(t *testing.T) {
	o, err := parse([]string{"--scenarios=F,D", "--attacher-flags=--worker-threads=20", "--controller-flags=--concurrent-attach-detach-syncs=100 -v=2"})
	if err != nil {
		t.Fatal(err)
	}
	if o.attacherFlags != "--worker-threads=20" || o.controllerFlags != "--concurrent-attach-detach-syncs=100 -v=2" {
		t.Fatalf("flags = %q / %q", o.attacherFlags, o.controllerFlags)
	}
	for _, args := range [][]string{
		{"--in-process", "--controller-flags=--concurrent-attach-detach-syncs=100"},
		{"--profile=/tmp/p", "--attacher-flags=--worker-threads=20"},
		{"--in-process", "--attacher-binary=/bin/true"},
	} {
		if _, err := parse(args); err == nil || !strings.Contains(err.Error(), "in process") {
			t.Errorf("parse(%q) = %v, want the in-process conflict", args, err)
		}
	}
}

func TestParseTakesCreatorCountsAndRefusesANegativeOne(t *testing.T) {
	o, err := parse([]string{"--pod-creators=16", "--va-creators=32"})
	if err != nil || o.podCreators != 16 || o.vaCreators != 32 {
		t.Fatalf("parse(--pod-creators=16 --va-creators=32) = %+v, %v", o, err)
	}
	for _, flag := range []string{"--pod-creators", "--va-creators", "--control-plane-gogc", "--control-plane-memory-limit-mib"} {
		if _, err := parse([]string{flag + "=-1"}); err == nil || !strings.Contains(err.Error(), flag) {
			t.Errorf("parse(%s=-1) = %v, want an error naming the flag", flag, err)
		}
	}
}

func TestParseControlPlaneCollectorDefaultsToGosOwnAndTakesASetting(t *testing.T) {
	o, err := parse(nil)
	if err != nil || o.controlPlaneGC != 0 || o.controlPlaneMiB != 0 {
		t.Fatalf("parse() control plane GOGC = %d, memory limit = %d MiB, %v; want 0 and 0 (Go's own)", o.controlPlaneGC, o.controlPlaneMiB, err)
	}
	o, err = parse([]string{"--control-plane-gogc=400", "--control-plane-memory-limit-mib=8192"})
	if err != nil || o.controlPlaneGC != 400 || o.controlPlaneMiB != 8192 {
		t.Errorf("parse(--control-plane-gogc=400 --control-plane-memory-limit-mib=8192) = %+v, %v", o, err)
	}
}
