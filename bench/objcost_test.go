package bench

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

var (
	objCostNodes   = flag.Int("objcost.nodes", 1000, "nodes of the per-object cost benchmark's world")
	objCostVolumes = flag.Int("objcost.volumes", 10000, "volumes (PVC, PV, Pod, VolumeAttachment each) of the per-object cost benchmark's world")
	objCostFake    = flag.Bool("objcost.fake", false, "build the per-object cost benchmark's objects on a fake clientset instead of the test binary's API server (faster; without what the API server adds)")
	objCostOut     = flag.String("objcost.out", "", "directory to write the per-object cost report to as JSON (make bench-objects: bench/results)")
)

// BenchmarkObjectCost measures the live heap each controller keeps per
// object of the scale scenario (docs/scale.md, "Per-object cost"). Run with
//
//	make bench-objects
//	go test -run '^$' -bench ObjectCost -benchtime 1x ./bench/ -args -objcost.volumes=10000 -objcost.nodes=1000
func BenchmarkObjectCost(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	var rep *objCostReport
	for b.Loop() {
		var err error
		client, err := objCostClient()
		if err != nil {
			b.Fatal(err)
		}
		if rep, err = measureObjCosts(ctx, client, *objCostNodes, *objCostVolumes); err != nil {
			b.Fatal(err)
		}
	}
	for _, c := range rep.Costs {
		b.ReportMetric(c.Bytes, c.metricUnit())
	}
	rep.table(os.Stdout)
	if *objCostOut != "" {
		path, err := rep.write(*objCostOut, time.Now())
		if err != nil {
			b.Fatal(err)
		}
		fmt.Fprintf(os.Stdout, "report: %s\n", path)
	}
}

// The measuring code on a small world: every figure is there, positive
// where it must be and within generous bounds, the transforms never make
// a cache larger, and the consistent world costs no CSI call.
func TestObjectCostSmallWorld(t *testing.T) {
	if runInChild(t) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rep, err := measureObjCosts(ctx, nil, 20, 200)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	rep.table(&b)
	t.Log("\n" + b.String())
	const bound = 64 << 10 // bytes per object or volume
	for _, comp := range []struct {
		name  string
		kinds []string
	}{
		{"csi-attacher", []string{"VA", "PV", "CSINode"}},
		{"attachdetach-controller", []string{"Pod", "Node", "PVC", "PV", "VA", "CSINode"}},
	} {
		for _, kind := range comp.kinds {
			with, ok1 := rep.get(comp.name, kind, "transformed")
			without, ok2 := rep.get(comp.name, kind, "untransformed")
			if !ok1 || !ok2 {
				t.Errorf("%s %s: no figure (transformed %v, untransformed %v)", comp.name, kind, ok1, ok2)
				continue
			}
			if with <= 0 || with > bound || without <= 0 || without > bound {
				t.Errorf("%s %s: %.0f B transformed, %.0f B untransformed; want both in (0, %d]", comp.name, kind, with, without, bound)
			}
			// 64 bytes of slack for the heap's noise.
			if with > without+64 {
				t.Errorf("%s %s: the transform makes the cache larger: %.0f B > %.0f B", comp.name, kind, with, without)
			}
		}
		total, ok := rep.get(comp.name, "total", "measured")
		if !ok || total <= 0 || total > bound {
			t.Errorf("%s: total %.0f B per volume (present %v); want in (0, %d]", comp.name, total, ok, bound)
		}
		if state, ok := rep.get(comp.name, "state", "measured"); !ok || state > bound || state < -bound {
			t.Errorf("%s: state %.0f B per volume (present %v); want within ±%d", comp.name, state, ok, bound)
		}
	}
	if n := rep.Writes["csi-attacher CSI calls"]; n != 0 {
		t.Errorf("csi-attacher made %d CSI calls on a world where every volume is published, want 0", n)
	}
}

// objCostClient is the clientset the benchmark builds its objects with: the
// package's API server (protobuf, no client-side rate limit), or nil for a
// fake one.
func objCostClient() (kubernetes.Interface, error) {
	if *objCostFake {
		return nil, nil
	}
	cfg := rest.CopyConfig(cluster.RESTConfig())
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.QPS, cfg.Burst = -1, -1
	return kubernetes.NewForConfig(cfg)
}
