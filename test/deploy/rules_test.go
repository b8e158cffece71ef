package deploy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// The alert rules ship in Prometheus' rule file format in the chart
// (charts/latch/rules, one group per file), which is their source: the
// chart's PrometheusRule reads them, deploy/overlays/prometheus-operator
// carries a copy (prometheusrule_test.go compares), and each file has a
// promtool unit test in test/deploy/testdata/rules.
const (
	rulesDir     = "charts/latch/rules"
	ruleTestsDir = "test/deploy/testdata/rules"
	// promtoolInstall is what the messages tell to run when promtool or
	// prometheus is missing; `make test` runs it first (make tools).
	promtoolInstall = "apt-get install -y prometheus (Debian's prometheus package has promtool and prometheus; `make tools` installs it, and `make test` runs that first)"
)

// ruleGroup is a group of a Prometheus rule file, and of a PrometheusRule's
// spec.groups (the Operator's field names are Prometheus').
type ruleGroup struct {
	Name     string `json:"name"`
	Interval string `json:"interval,omitempty"`
	Rules    []rule `json:"rules"`
}

type rule struct {
	Alert       string            `json:"alert,omitempty"`
	Record      string            `json:"record,omitempty"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// ruleFiles returns the rule files' base names, sorted.
func ruleFiles(t *testing.T) []string {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(repoRoot(t), rulesDir, "*.rules.yaml"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no rule files in %s (%v)", rulesDir, err)
	}
	var out []string
	for _, p := range paths {
		out = append(out, filepath.Base(p))
	}
	slices.Sort(out)
	return out
}

// readRuleGroups reads a rule file strictly (an unknown field is an error).
func readRuleGroups(t *testing.T, file string) []ruleGroup {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), rulesDir, file))
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []ruleGroup `json:"groups"`
	}
	if err := yaml.UnmarshalStrict(raw, &f); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return f.Groups
}

// allRuleGroups are the groups of every rule file, in file order.
func allRuleGroups(t *testing.T) []ruleGroup {
	t.Helper()
	var out []ruleGroup
	for _, f := range ruleFiles(t) {
		out = append(out, readRuleGroups(t, f)...)
	}
	return out
}

// debianPrometheusTool returns the path of promtool or prometheus, failing
// the test (never skipping it) when it is not installed.
func debianPrometheusTool(t *testing.T, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s is not installed: %s", name, promtoolInstall)
	}
	return p
}

// promtoolTest is the part of a promtool unit test file the checks below
// read.
type promtoolTest struct {
	RuleFiles []string `json:"rule_files"`
	Tests     []struct {
		AlertRuleTest []struct {
			AlertName string `json:"alertname"`
			ExpAlerts []any  `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

// Every rule file holds one group and passes `promtool check rules`; each
// has a unit test file of the same name that `promtool test rules` passes,
// and that test makes each alert of the group fire at least once and
// checks it silent at least once.
func TestPrometheusRulesPassPromtool(t *testing.T) {
	bin := debianPrometheusTool(t, "promtool")
	root := repoRoot(t)
	var ruleArgs, testArgs []string
	for _, f := range ruleFiles(t) {
		groups := readRuleGroups(t, f)
		if len(groups) != 1 {
			t.Errorf("%s holds %d groups, want one (one promtool test file per group)", f, len(groups))
			continue
		}
		ruleArgs = append(ruleArgs, filepath.Join(rulesDir, f))
		testFile := filepath.Join(ruleTestsDir, strings.TrimSuffix(f, ".rules.yaml")+".test.yaml")
		testArgs = append(testArgs, testFile)
		raw, err := os.ReadFile(filepath.Join(root, testFile))
		if err != nil {
			t.Errorf("group %s has no promtool test: %v", groups[0].Name, err)
			continue
		}
		var pt promtoolTest
		if err := yaml.Unmarshal(raw, &pt); err != nil {
			t.Fatalf("%s: %v", testFile, err)
		}
		if want := "../../../../" + filepath.ToSlash(filepath.Join(rulesDir, f)); !slices.Equal(pt.RuleFiles, []string{want}) {
			t.Errorf("%s tests rule files %v, want [%s]", testFile, pt.RuleFiles, want)
		}
		fires, silent := map[string]bool{}, map[string]bool{}
		for _, tc := range pt.Tests {
			for _, a := range tc.AlertRuleTest {
				if len(a.ExpAlerts) > 0 {
					fires[a.AlertName] = true
				} else {
					silent[a.AlertName] = true
				}
			}
		}
		for _, r := range groups[0].Rules {
			if r.Alert == "" {
				continue
			}
			if !fires[r.Alert] {
				t.Errorf("%s: no case where %s fires", testFile, r.Alert)
			}
			if !silent[r.Alert] {
				t.Errorf("%s: no case where %s stays silent", testFile, r.Alert)
			}
		}
	}
	for _, args := range [][]string{append([]string{"check", "rules"}, ruleArgs...), append([]string{"test", "rules"}, testArgs...)} {
		cmd := exec.Command(bin, args...)
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
			continue
		}
		t.Logf("promtool %s:\n%s", strings.Join(args[:2], " "), out)
	}
}

// The alert table of docs/metrics.md lists every alert the rules define,
// each with the rule's expression, and explains it under a heading the
// rule's runbook_url points to.
func TestEveryAlertIsDocumented(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), "docs/metrics.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	const runbookBase = "https://github.com/latchcsi/latch/blob/main/docs/metrics.md#"
	n := 0
	for _, g := range allRuleGroups(t) {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			n++
			if r.Labels["severity"] == "" {
				t.Errorf("%s has no severity label", r.Alert)
			}
			for _, a := range []string{"summary", "description"} {
				if r.Annotations[a] == "" {
					t.Errorf("%s has no %s annotation", r.Alert, a)
				}
			}
			if want := runbookBase + strings.ToLower(r.Alert); r.Annotations["runbook_url"] != want {
				t.Errorf("%s: runbook_url %q, want %q", r.Alert, r.Annotations["runbook_url"], want)
			}
			if !strings.Contains(doc, "\n### "+r.Alert+"\n") {
				t.Errorf("docs/metrics.md has no heading ### %s", r.Alert)
			}
			row := "| [`" + r.Alert + "`](#" + strings.ToLower(r.Alert) + ") | `" + markdownCode(oneLine(r.Expr)) + "` |"
			if !strings.Contains(doc, row) {
				t.Errorf("docs/metrics.md's alert table has no row starting\n%s", row)
			}
		}
	}
	if n < 10 {
		t.Errorf("found %d alerts, want the dozen or so the rule files define", n)
	}
}

// oneLine joins a multi-line expression with single spaces.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// markdownCode escapes what a table cell's code span cannot hold.
func markdownCode(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
