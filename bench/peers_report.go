package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// The rows of the final table, in order: figure key and label.
var (
	peerAttacherRows = [][2]string{
		{"attach_paced_p50_ms", "attach p50 ms, paced"},
		{"attach_paced_p99_ms", "attach p99 ms, paced"},
		{"detach_paced_p50_ms", "detach p50 ms, paced"},
		{"detach_paced_p99_ms", "detach p99 ms, paced"},
		{"attach_saturated_p50_ms", "attach p50 ms, saturated"},
		{"attach_saturated_p99_ms", "attach p99 ms, saturated"},
		{"detach_saturated_p50_ms", "detach p50 ms, saturated"},
		{"detach_saturated_p99_ms", "detach p99 ms, saturated"},
		{"attach_saturated_per_s", "attaches/s, saturated"},
		{"publishes_per_va", "publishes per VA"},
		{"writes_per_attach", "writes per attach"},
		{"writes_per_detach", "writes per detach"},
		{"cpu_s", "CPU s"},
		{"peak_rss_mb", "peak RSS MB"},
	}
	peerControllerRows = [][2]string{
		{"pod_to_node_status_p50_ms", "Pod → node status p50 ms"},
		{"pod_to_node_status_p99_ms", "Pod → node status p99 ms"},
		{"pod_deleted_to_va_gone_p50_ms", "Pod deleted → VA gone p50 ms"},
		{"pod_deleted_to_va_gone_p99_ms", "Pod deleted → VA gone p99 ms"},
		{"controller_writes_per_pod", "controller writes per Pod"},
		{"controller_cpu_s", "controller CPU s"},
		{"controller_peak_rss_mb", "controller peak RSS MB"},
	}
)

// peerKey names a contender in Medians and Ratios: "attacher/latch adaptive".
func peerKey(kind, name string) string { return kind + "/" + name }

// summarize fills Medians and Ratios from Runs.
func (r *PeersReport) summarize() {
	values := map[string]map[string][]float64{}
	for _, run := range r.Runs {
		k := peerKey(run.Kind, run.Contender)
		if values[k] == nil {
			values[k] = map[string][]float64{}
		}
		for f, v := range run.Figures {
			values[k][f] = append(values[k][f], v)
		}
	}
	r.Medians = map[string]map[string]float64{}
	for k, figs := range values {
		r.Medians[k] = map[string]float64{}
		for f, vs := range figs {
			r.Medians[k][f] = median(vs)
		}
	}
	r.Ratios = map[string]map[string]float64{}
	for k, m := range r.Medians {
		kind, _, _ := strings.Cut(k, "/")
		ref := r.Medians[peerKey(kind, referenceOf(kind))]
		if ref == nil || k == peerKey(kind, referenceOf(kind)) {
			continue
		}
		r.Ratios[k] = map[string]float64{}
		for f, v := range m {
			if base := ref[f]; base != 0 {
				r.Ratios[k][f] = v / base
			}
		}
	}
}

func referenceOf(kind string) string {
	if kind == "controller" {
		return PeerLatchController
	}
	return PeerLatchAdaptive
}

// median of vs (the mean of the middle two for an even count).
func median(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	m := len(s) / 2
	if len(s)%2 == 1 {
		return s[m]
	}
	return (s[m-1] + s[m]) / 2
}

// printPeerRun prints one run's figures and its failed checks.
func printPeerRun(w io.Writer, run *PeerRun) {
	keys := make([]string, 0, len(run.Figures))
	for k := range run.Figures {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, k+"="+trimFloat(run.Figures[k]))
	}
	fmt.Fprintf(w, "round %d %s %q (%.0f s): %s\n", run.Round, run.Kind, run.Contender, run.Seconds, strings.Join(parts, " "))
	if run.Error != "" {
		fmt.Fprintf(w, "    ERROR %s\n", run.Error)
	}
	passed := 0
	for _, c := range run.Checks {
		if c.Pass {
			passed++
			continue
		}
		what := "FAIL"
		if !run.latch {
			what = "FINDING"
		}
		fmt.Fprintf(w, "    %s %s: %s (target %s)\n", what, c.Name, c.Value, c.Target)
	}
	fmt.Fprintf(w, "    %d of %d correctness checks passed\n", passed, len(run.Checks))
}

// PrintTable prints the medians over the rounds, each beside its ratio to
// the reference contender's median (contender ÷ latch).
func (r *PeersReport) PrintTable(w io.Writer) {
	fmt.Fprintf(w, "\nbench-peers %s, %d round(s), medians (× = the contender's median ÷ latch's; above 1 means latch's is lower)\n", r.Scale, r.Rounds)
	var attachers, backends, controllers []string
	for _, a := range r.Attachers {
		if a.Latency {
			attachers = append(attachers, a.Name)
		}
		if a.Backends {
			backends = append(backends, a.Name)
		}
	}
	for _, c := range r.Controllers {
		controllers = append(controllers, c.Name)
	}
	r.printRows(w, "csi-attacher", "attacher", attachers, peerAttacherRows)
	var rows [][2]string
	for _, p := range r.Profiles {
		rows = append(rows,
			[2]string{"backend_" + p + "_capacity_percent", p + ": % of capacity"},
			[2]string{"backend_" + p + "_throttled_percent", p + ": % throttled"},
			[2]string{"backend_" + p + "_attach_p99_ms", p + ": attach p99 ms"})
	}
	r.printRows(w, "backend profiles", "attacher", backends, rows)
	r.printRows(w, "attach/detach controller", "controller", controllers, peerControllerRows)
	for _, s := range r.Skipped {
		fmt.Fprintf(w, "SKIPPED %s\n", s)
	}
}

func (r *PeersReport) printRows(w io.Writer, title, kind string, names []string, rows [][2]string) {
	if len(names) == 0 {
		return
	}
	const label, col = 32, 24
	fmt.Fprintf(w, "\n%-*s", label, title)
	for _, n := range names {
		fmt.Fprintf(w, " %*s", col, n)
	}
	fmt.Fprintln(w)
	for _, row := range rows {
		fmt.Fprintf(w, "%-*s", label, row[1])
		for _, n := range names {
			k := peerKey(kind, n)
			v, ok := r.Medians[k][row[0]]
			cell := "-"
			if ok {
				cell = trimFloat(v)
				if ratio, ok := r.Ratios[k][row[0]]; ok {
					cell += fmt.Sprintf(" (%.2f×)", ratio)
				}
			}
			fmt.Fprintf(w, " %*s", col, cell)
		}
		fmt.Fprintln(w)
	}
}

// WriteJSON writes the report to path, creating its directory.
func (r *PeersReport) WriteJSON(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}
