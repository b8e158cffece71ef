package deploy_test

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// prometheusRuleGroups returns the groups of the one PrometheusRule among
// objs, read strictly, sorted by name.
func prometheusRuleGroups(t *testing.T, where string, objs []*unstructured.Unstructured) []ruleGroup {
	t.Helper()
	var found []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "PrometheusRule" {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%s renders %d PrometheusRules, want 1", where, len(found))
	}
	raw, err := found[0].MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	var pr struct {
		APIVersion string         `json:"apiVersion"`
		Kind       string         `json:"kind"`
		Metadata   map[string]any `json:"metadata"`
		Spec       struct {
			Groups []ruleGroup `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.UnmarshalStrict(raw, &pr); err != nil {
		t.Fatalf("%s: PrometheusRule %s: %v", where, found[0].GetName(), err)
	}
	return sortedGroups(pr.Spec.Groups)
}

func sortedGroups(gs []ruleGroup) []ruleGroup {
	gs = slices.Clone(gs)
	slices.SortFunc(gs, func(a, b ruleGroup) int { return strings.Compare(a.Name, b.Name) })
	return gs
}

func groupNames(gs []ruleGroup) []string {
	var out []string
	for _, g := range gs {
		out = append(out, g.Name)
	}
	return out
}

// sameGroups reports how got differs from want, group by group.
func sameGroups(t *testing.T, where string, got, want []ruleGroup) {
	t.Helper()
	if !slices.Equal(groupNames(got), groupNames(want)) {
		t.Errorf("%s: groups %v, want %v", where, groupNames(got), groupNames(want))
		return
	}
	for i := range want {
		if !reflect.DeepEqual(got[i], want[i]) {
			g, _ := yaml.Marshal(got[i])
			w, _ := yaml.Marshal(want[i])
			t.Errorf("%s: group %s differs from %s/*.rules.yaml (copy the file's groups over):\n%s\nwant:\n%s", where, want[i].Name, rulesDir, g, w)
		}
	}
}

// The overlay's PrometheusRule holds the rule files' groups, every one and
// unchanged.
func TestPrometheusRuleOverlayEqualsTheRuleFiles(t *testing.T) {
	const dir = "deploy/overlays/prometheus-operator"
	sameGroups(t, dir, prometheusRuleGroups(t, dir, kustomize(t, dir)), sortedGroups(allRuleGroups(t)))
}

// The chart's switches: by default no PodMonitor and no PrometheusRule; with
// metrics.podMonitor.enabled a PodMonitor for the controller's and the
// driver's Pods, each scraping a port they serve metrics on, and no scrape
// annotations; with metrics.prometheusRule.enabled the rule files' groups,
// the same as the overlay's, less the groups of a part that is off. A
// PodMonitor that would scrape a loopback endpoint fails the render.
func TestHelmChartMonitoringSwitches(t *testing.T) {
	objs := mustHelmTemplate(t, "kube-system", nil)
	for _, kind := range []string{"PodMonitor", "PrometheusRule"} {
		if slices.ContainsFunc(objs, func(o *unstructured.Unstructured) bool { return o.GetKind() == kind }) {
			t.Errorf("defaults render a %s; it needs the Operator's CRDs and must be asked for", kind)
		}
	}

	on := map[string]any{
		"metrics":                map[string]any{"podMonitor": map[string]any{"enabled": true, "labels": map[string]any{"release": "prom"}}, "prometheusRule": map[string]any{"enabled": true, "labels": map[string]any{"release": "prom"}}},
		"attachdetachController": map[string]any{"httpEndpoint": true},
		"csiAttacher":            map[string]any{"httpEndpoint": true},
		"driver":                 map[string]any{"enabled": true},
	}
	objs = mustHelmTemplate(t, "mon", on)
	if n := checkPodMonitors(t, "chart", objs); n != 2 {
		t.Errorf("chart renders %d PodMonitors, want the controller's and the driver's", n)
	}
	for _, o := range objs {
		if k := o.GetKind(); (k == "PodMonitor" || k == "PrometheusRule") && o.GetLabels()["release"] != "prom" {
			t.Errorf("%s %s labels %v lack the values' release=prom", k, o.GetName(), o.GetLabels())
		}
	}
	want := sortedGroups(allRuleGroups(t))
	sameGroups(t, "chart", prometheusRuleGroups(t, "chart", objs), want)
	const overlay = "deploy/overlays/prometheus-operator"
	sameGroups(t, "chart against "+overlay, prometheusRuleGroups(t, "chart", objs), prometheusRuleGroups(t, overlay, kustomize(t, overlay)))

	objs = mustHelmTemplate(t, "mon", map[string]any{
		"metrics":                map[string]any{"prometheusRule": map[string]any{"enabled": true}},
		"attachdetachController": map[string]any{"enabled": false},
	})
	var attacherOnly []ruleGroup
	for _, g := range want {
		if g.Name != "latch-attachdetach-controller" {
			attacherOnly = append(attacherOnly, g)
		}
	}
	sameGroups(t, "chart without the controller", prometheusRuleGroups(t, "chart", objs), attacherOnly)

	for _, c := range []struct {
		vals map[string]any
		want string
	}{
		{map[string]any{"metrics": map[string]any{"podMonitor": map[string]any{"enabled": true}}}, "needs attachdetachController.httpEndpoint"},
		{map[string]any{"metrics": map[string]any{"podMonitor": map[string]any{"enabled": true}}, "attachdetachController": map[string]any{"httpEndpoint": true}, "driver": map[string]any{"enabled": true}}, "needs csiAttacher.httpEndpoint"},
	} {
		_, err := helmTemplate(t, "mon", c.vals)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("values %v: render error %v, want one that %s", fmt.Sprint(c.vals), err, c.want)
		}
	}
}
