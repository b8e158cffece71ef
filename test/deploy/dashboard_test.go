package deploy_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const dashboardPath = "deploy/grafana/latch-dashboard.json"

var (
	promString    = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'`)
	promMatchers  = regexp.MustCompile(`\{[^}]*\}`)
	promRange     = regexp.MustCompile(`\[[^\]]*\]`)
	promLabelList = regexp.MustCompile(`(?i)\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promIdent     = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*`)
	labelValues   = regexp.MustCompile(`label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*,`)
)

// promKeywords are PromQL words that look like identifiers but are not
// metric names.
var promKeywords = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true,
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true, "inf": true, "nan": true}

// promqlMetricNames returns the metric names a PromQL expression selects:
// identifiers that are not function or aggregation names (those are
// followed by "("), not label names (inside {...}, by (...) and the like)
// and not keywords.
func promqlMetricNames(expr string) []string {
	s := promString.ReplaceAllString(expr, `""`)
	s = promMatchers.ReplaceAllString(s, " ")
	s = promRange.ReplaceAllString(s, " ")
	s = promLabelList.ReplaceAllString(s, " ")
	var out []string
	for _, loc := range promIdent.FindAllStringIndex(s, -1) {
		word := s[loc[0]:loc[1]]
		if loc[0] > 0 && (s[loc[0]-1] == '$' || (s[loc[0]-1] >= '0' && s[loc[0]-1] <= '9') || s[loc[0]-1] == '.') {
			continue // a Grafana variable ($__rate_interval) or part of a number (1e3)
		}
		rest := strings.TrimLeft(s[loc[1]:], " \t\n")
		if strings.HasPrefix(rest, "(") || promKeywords[strings.ToLower(word)] {
			continue
		}
		if !slices.Contains(out, word) {
			out = append(out, word)
		}
	}
	return out
}

func TestPromQLMetricNames(t *testing.T) {
	cases := map[string][]string{
		`histogram_quantile(0.99, sum by (le, name) (rate(workqueue_queue_duration_seconds_bucket{job=~"$job", name!="x"}[$__rate_interval])))`:                                   {"workqueue_queue_duration_seconds_bucket"},
		`sum by (operation, code) (rate(latch_attacher_csi_errors_total[5m])) / on (operation) group_left sum(rate(csi_sidecar_operations_seconds_count{method_name="a b"}[5m]))`: {"latch_attacher_csi_errors_total", "csi_sidecar_operations_seconds_count"},
		`max by (name) (latch_workqueue_oldest_item_age_seconds) > 1e3 and up offset 5m`:                                                                                          {"latch_workqueue_oldest_item_age_seconds", "up"},
	}
	for expr, want := range cases {
		if got := promqlMetricNames(expr); !slices.Equal(got, want) {
			t.Errorf("promqlMetricNames(%s) = %v, want %v", expr, got, want)
		}
	}
}

// grafanaDashboard is the part of the dashboard the tests read.
type grafanaDashboard struct {
	Panels []struct {
		Title   string
		Targets []struct{ Expr string }
	}
	Templating struct {
		List []struct {
			Name  string
			Query json.RawMessage
		}
	}
}

func readDashboard(t *testing.T) grafanaDashboard {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), dashboardPath))
	if err != nil {
		t.Fatal(err)
	}
	var dash grafanaDashboard
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	return dash
}

// dashboardMetrics returns every metric the dashboard queries (panel
// targets and template variable queries), with a panel title for each.
func dashboardMetrics(t *testing.T) map[string]string {
	t.Helper()
	dash := readDashboard(t)
	out := map[string]string{}
	for _, p := range dash.Panels {
		for _, target := range p.Targets {
			if strings.TrimSpace(target.Expr) == "" {
				t.Errorf("panel %q has a target without an expression", p.Title)
			}
			for _, m := range promqlMetricNames(target.Expr) {
				out[m] = p.Title
			}
		}
	}
	for _, v := range dash.Templating.List {
		for _, m := range labelValues.FindAllStringSubmatch(string(v.Query), -1) {
			out[m[1]] = "variable " + v.Name
		}
	}
	return out
}
