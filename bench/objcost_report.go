package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"
)

// objCostComponents lists the components in report order.
var objCostComponents = []string{"csi-attacher", "attachdetach-controller"}

// perCluster counts the objects of kind in a cluster of nodes and volumes
// shaped like the scale world (one PVC, PV, Pod and VA per volume).
func perCluster(kind string, nodes, volumes int) int {
	if kind == "Node" || kind == "CSINode" {
		return nodes
	}
	return volumes
}

// projectHeap is the live heap component would hold for a cluster of nodes
// and volumes, from the measured per-object costs (transformed caches,
// plus the state per volume, plus what it holds with no objects).
func (r *objCostReport) projectHeap(component string, nodes, volumes int) float64 {
	var heap float64
	for _, c := range r.Costs {
		if c.Component != component {
			continue
		}
		switch {
		case c.Variant == "transformed":
			heap += c.Bytes * float64(perCluster(c.Kind, nodes, volumes))
		case c.Kind == "state":
			heap += c.Bytes * float64(volumes)
		case c.Kind == "fixed":
			heap += c.Bytes
		}
	}
	return heap
}

// table prints the figures and the live heap they project.
func (r *objCostReport) table(out io.Writer) {
	from := "a fake clientset"
	if r.APIServer {
		from = "the API server"
	}
	fmt.Fprintf(out, "per-object live heap, %d nodes / %d volumes (objects built through %s in %.0fs)\n", r.Nodes, r.Volumes, from, r.BuildS)
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "component\tkind\tobjects\tB/object transformed\tB/object whole\tsaved\t")
	for _, comp := range objCostComponents {
		for _, k := range objKinds {
			with, ok := r.get(comp, k.kind, "transformed")
			if !ok {
				continue
			}
			without, _ := r.get(comp, k.kind, "untransformed")
			saved := 0.0
			if without > 0 {
				saved = 100 * (without - with) / without
			}
			fmt.Fprintf(w, "%s\t%s\t%d\t%.0f\t%.0f\t%.0f%%\t\n", comp, k.kind, perCluster(k.kind, r.Nodes, r.Volumes), with, without, saved)
		}
		state, _ := r.get(comp, "state", "measured")
		total, _ := r.get(comp, "total", "measured")
		fixed, _ := r.get(comp, "fixed", "measured")
		fmt.Fprintf(w, "%s\tstate per volume\t%d\t%.0f\t\t\t\n", comp, r.Volumes, state)
		fmt.Fprintf(w, "%s\ttotal per volume\t%d\t%.0f\t\t\t\n", comp, r.Volumes, total)
		fmt.Fprintf(w, "%s\twith no objects (MB)\t\t%.1f\t\t\t\n", comp, fixed/1e6)
	}
	fmt.Fprintln(w, "\t\t\t\t\t\t")
	fmt.Fprintln(w, "projected live heap\tnodes\tvolumes\tMB\t\t\t")
	for _, size := range [][2]int{{r.Nodes, r.Volumes}, {10000, 100000}, {50000, 1000000}} {
		sum := 0.0
		for _, comp := range objCostComponents {
			h := r.projectHeap(comp, size[0], size[1])
			sum += h
			fmt.Fprintf(w, "%s\t%d\t%d\t%.0f\t\t\t\n", comp, size[0], size[1], h/1e6)
		}
		fmt.Fprintf(w, "both\t%d\t%d\t%.0f\t\t\t\n", size[0], size[1], sum/1e6)
	}
	for _, k := range []string{"csi-attacher API writes", "csi-attacher CSI calls", "attachdetach-controller API writes"} {
		fmt.Fprintf(w, "%s while measured\t%d\t\t\t\t\t\n", k, r.Writes[k])
	}
	w.Flush()
}

// write stores the report as bench/results/latch-objcost-<UTC time>.json
// (dir is the results directory) and returns its path.
func (r *objCostReport) write(dir string, at time.Time) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	type projection struct {
		Nodes   int                `json:"nodes"`
		Volumes int                `json:"volumes"`
		HeapMB  map[string]float64 `json:"live_heap_mb"`
	}
	out := struct {
		*objCostReport
		Finished   string       `json:"finished"`
		Projection []projection `json:"projection"`
	}{objCostReport: r, Finished: at.UTC().Format(time.RFC3339)}
	for _, size := range [][2]int{{10000, 100000}, {50000, 1000000}} {
		p := projection{Nodes: size[0], Volumes: size[1], HeapMB: map[string]float64{}}
		for _, comp := range objCostComponents {
			p.HeapMB[comp] = round2(r.projectHeap(comp, size[0], size[1]) / 1e6)
		}
		out.Projection = append(out.Projection, p)
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, fmt.Sprintf("latch-objcost-%s.json", at.UTC().Format("20060102T150405Z")))
	return path, os.WriteFile(path, append(b, '\n'), 0o644)
}
