package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"
)

// JSON is the report as one object: the figures at the top level (the
// issue's names, kcm_ for kube-controller-manager, null when not
// measured), then "checks" and "notes".
func (r *ScaleReport) JSON() ([]byte, error) {
	out := map[string]any{}
	for k, v := range r.Figures {
		out[k] = v
	}
	out["checks"] = r.Checks
	out["notes"] = r.Notes
	return json.MarshalIndent(out, "", "  ")
}

// WriteJSON writes the report to dir/latch-scale-<size>-<UTC>.json and
// returns the path.
func (r *ScaleReport) WriteJSON(dir string, size ScaleSize, at time.Time) (string, error) {
	b, err := r.JSON()
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	path := filepath.Join(dir, fmt.Sprintf("latch-scale-%s-%s.json", size, at.UTC().Format("20060102T150405Z")))
	return path, os.WriteFile(path, append(b, '\n'), 0o644)
}

// PrintTable prints latch beside kube-controller-manager, then the checks.
func (r *ScaleReport) PrintTable(out io.Writer) {
	fmt.Fprintf(out, "\n%-34s %14s %14s\n", "figure", "latch", "kcm")
	for _, k := range []string{
		"controller_ready_s", "controller_rebuilt_s", "controller_first_action_s", "controller_attached_s",
		"controller_peak_rss_mb", "controller_cpu_s_first_window", "controller_writes_first_minute",
		"controller_idle_cpu_percent", "controller_idle_gc_cpu_percent", "controller_idle_gcs", "controller_idle_gcs_periodic",
		"controller_idle_rss_mb", "idle_api_requests_per_minute",
		"controller_trickle_cpu_percent", "controller_trickle_rss_mb", "trickle_api_requests_per_minute", "controller_trickle_writes_per_minute",
		"trickle_pods_created", "trickle_attach_p50_s", "trickle_attach_p99_s",
		"recovery_volumes", "recovery_p50_s", "recovery_p99_s", "recovery_all_attached_s", "recovery_fail_s", "controller_recovery_cpu_s", "recovery_api_writes_per_s", "recovery_double_attached",
	} {
		fmt.Fprintf(out, "%-34s %14s %14s\n", k, show(r.Figures[k]), show(r.Figures["kcm_"+k]))
	}
	for _, k := range []string{
		"attacher_ready_s", "attacher_peak_rss_mb", "attacher_cpu_s_first_window", "attacher_publishes_at_start",
		"attacher_unpublishes_at_start", "attacher_writes_first_window", "listvolumes_reconcile_wall_s", "listvolumes_reconcile_cpu_s",
		"attacher_limited_container_memory_mib", "attacher_limited_gomemlimit_mib", "attacher_limited_ready_s",
		"attacher_limited_peak_rss_mb", "attacher_limited_cpu_s", "attacher_limited_gc_cpu_s",
		"create_total_s", "harness_writes", "control_plane_peak_rss_mb", "wall_s",
	} {
		fmt.Fprintf(out, "%-34s %14s %14s\n", k, show(r.Figures[k]), "")
	}
	for _, k := range []string{"attacher_writes_first_window_by_kind", "controller_writes_first_window_by_kind", "kcm_controller_writes_first_window_by_kind",
		"controller_trickle_writes_by_kind", "kcm_controller_trickle_writes_by_kind",
		"recovery_api_writes_by_kind", "kcm_recovery_api_writes_by_kind",
		"recovery_stages_p50_s", "kcm_recovery_stages_p50_s", "recovery_stages_p99_s", "kcm_recovery_stages_p99_s"} {
		if v := r.Figures[k]; v != nil {
			fmt.Fprintf(out, "%s: %v\n", k, v)
		}
	}
	fmt.Fprintln(out)
	for _, c := range r.Checks {
		verdict := "PASS"
		if !c.Pass {
			verdict = "FAIL"
		}
		fmt.Fprintf(out, "%s %s: %s (want %s)\n", verdict, c.Name, c.Value, c.Target)
	}
	for _, n := range r.Notes {
		fmt.Fprintln(out, "note:", n)
	}
}

func show(v any) string {
	switch x := v.(type) {
	case nil:
		return "-"
	case float64:
		if x != 0 && x < 0.1 {
			return fmt.Sprintf("%.3f", x)
		}
		return fmt.Sprintf("%.2f", x)
	default:
		return fmt.Sprint(x)
	}
}
