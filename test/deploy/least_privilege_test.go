package deploy_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// attacherContainers returns every csi-attacher container of ds.
func attacherContainers(ds []*appsv1.Deployment) map[string]v1.Container {
	out := map[string]v1.Container{}
	for _, d := range ds {
		for _, c := range d.Spec.Template.Spec.Containers {
			if bin, ok := latchBinary(c.Image); ok && bin == "csi-attacher" {
				out[d.Name+"/"+c.Name] = c
			}
		}
	}
	return out
}

// secretGrants lists the Roles and ClusterRoles among objs that grant
// anything on Secrets.
func secretGrants(objs []*rbacv1.Unstructured) []string {
	var out []string
	for _, o := range objs {
		if o.GetKind() != "ClusterRole" && o.GetKind() != "Role" {
			continue
		}
		if grantsSecrets([]*rbacv1.Unstructured{{Object: map[string]any{"kind": "ClusterRole", "metadata": map[string]any{"name": "x"}, "rules": o.Object["rules"]}}}, "x") {
			out = append(out, o.GetKind()+" "+o.GetName())
		}
	}
	return out
}

// Upstream external-attacher ships the Secret rule commented out; latch's
// defaults grant no Secret access either, in deploy/ and in the chart.
func TestAttacherGetsNoSecretAccessByDefault(t *testing.T) {
	for _, dir := range []string{"deploy/csi-attacher", "deploy/examples/mock-driver", "deploy/examples/mock-driver-metrics"} {
		if got := secretGrants(kustomize(t, dir)); len(got) != 0 {
			t.Errorf("%s grants Secret access by default: %v", dir, got)
		}
	}
	for name, vals := range map[string]map[string]any{
		"defaults":       nil,
		"driver.enabled": {"driver": map[string]any{"enabled": true}},
	} {
		if got := secretGrants(mustHelmTemplate(t, "sec", vals)); len(got) != 0 {
			t.Errorf("chart (%s) grants Secret access by default: %v", name, got)
		}
	}
}

// The documented switches grant get on Secrets, cluster-wide, to the
// attacher's ServiceAccount: the read-secrets overlay and the chart's
// csiAttacher.readSecrets.
func TestAttacherSecretSwitchesGrantGetSecrets(t *testing.T) {
	objs := kustomize(t, "deploy/overlays/csi-attacher-read-secrets")
	got := secretGrants(objs)
	if !slices.Equal(got, []string{"ClusterRole latch-csi-attacher-read-secrets"}) {
		t.Fatalf("read-secrets overlay: roles granting Secrets = %v, want ClusterRole latch-csi-attacher-read-secrets", got)
	}
	if g := grants(t, objs); !slices.Contains(g, "ClusterRole /secrets get") || slices.Contains(g, "ClusterRole /secrets list") {
		t.Errorf("read-secrets overlay grants %v, want get (only) on secrets", g)
	}
	bound := false
	for _, o := range objs {
		if o.GetKind() != "ClusterRoleBinding" {
			continue
		}
		ref, _, _ := rbacv1.NestedString(o.Object, "roleRef", "name")
		subs, _, _ := rbacv1.NestedSlice(o.Object, "subjects")
		for _, s := range subs {
			m, _ := s.(map[string]any)
			if ref == "latch-csi-attacher-read-secrets" && m["kind"] == "ServiceAccount" && m["name"] == "csi-attacher" && m["namespace"] == "latch-system" {
				bound = true
			}
		}
	}
	if !bound {
		t.Error("read-secrets overlay does not bind latch-csi-attacher-read-secrets to ServiceAccount latch-system/csi-attacher")
	}
	// The overlay still contains the whole base.
	if !hasObject(objs, "ClusterRole", "latch-csi-attacher") || !hasObject(objs, "ServiceAccount", "csi-attacher") {
		t.Error("read-secrets overlay lacks the csi-attacher base")
	}
	if !grantsSecrets(mustHelmTemplate(t, "sec", map[string]any{"csiAttacher": map[string]any{"readSecrets": true}}), "latch-csi-attacher-sec") {
		t.Error("chart with csiAttacher.readSecrets=true does not grant get on Secrets")
	}
}

// Every shipped csi-attacher runs with --leader-election: two attachers of
// one driver without it race each other (a surge Pod of a rolling update is
// enough).
func TestEveryAttacherManifestRunsWithLeaderElection(t *testing.T) {
	seen := 0
	check := func(where string, c v1.Container) {
		seen++
		on := false
		for _, a := range c.Args {
			switch strings.TrimLeft(a, "-") {
			case "leader-election", "leader-election=true":
				on = true
			case "leader-election=false":
				on = false
			}
		}
		if !on {
			t.Errorf("%s: csi-attacher args %v, want --leader-election", where, c.Args)
		}
	}
	for _, dir := range kustomizations(t) {
		for name, c := range attacherContainers(deployments(t, kustomize(t, dir))) {
			check(dir+" "+name, c)
		}
	}
	for name, c := range attacherContainers(deployments(t, mustHelmTemplate(t, "drv", map[string]any{"driver": map[string]any{"enabled": true}}))) {
		check("chart "+name, c)
	}
	if seen < 3 {
		t.Fatalf("checked %d csi-attacher containers, want the mock-driver example, the scrape overlay and the chart", seen)
	}
	// Documentation snippets that run the sidecar say so too.
	root := repoRoot(t)
	docs, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	docs = append(docs, filepath.Join(root, "README.md"), filepath.Join(root, "charts", "latch", "README.md"))
	examples, _ := filepath.Glob(filepath.Join(root, "examples", "*"))
	for _, f := range append(docs, examples...) {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for i, block := range strings.Split(string(data), "```") {
			if strings.HasSuffix(f, ".md") && i%2 == 0 {
				continue // prose, not a code block
			}
			if strings.Contains(block, "csi-attacher") && strings.Contains(block, "--csi-address") &&
				(!strings.Contains(block, "--leader-election") || strings.Contains(block, "--leader-election=false")) {
				t.Errorf("%s: snippet runs csi-attacher without --leader-election:\n%s", f, block)
			}
		}
	}
}

// Upstream's flag default and deploy example serve no HTTP endpoint; latch's
// do not either, unless the scrape overlay or csiAttacher.httpEndpoint asks.
func TestAttacherServesMetricsOnlyWhenAskedTo(t *testing.T) {
	hasEndpoint := func(c v1.Container) bool {
		return slices.ContainsFunc(c.Args, func(a string) bool {
			a = strings.TrimLeft(a, "-")
			return (strings.HasPrefix(a, "http-endpoint=") && a != "http-endpoint=") || (strings.HasPrefix(a, "metrics-address=") && a != "metrics-address=")
		})
	}
	off := map[string][]*appsv1.Deployment{
		"deploy/examples/mock-driver": deployments(t, kustomize(t, "deploy/examples/mock-driver")),
		"chart driver.enabled":        deployments(t, mustHelmTemplate(t, "drv", map[string]any{"driver": map[string]any{"enabled": true}})),
	}
	for where, ds := range off {
		for name, c := range attacherContainers(ds) {
			if hasEndpoint(c) || len(c.Ports) != 0 || c.LivenessProbe != nil {
				t.Errorf("%s %s: args %v ports %v probe %v, want no HTTP endpoint by default", where, name, c.Args, c.Ports, c.LivenessProbe)
			}
		}
		for _, d := range ds {
			if d.Name == "csi-mock-controller" && d.Spec.Template.Annotations["prometheus.io/scrape"] == "true" {
				t.Errorf("%s: driver Pods carry scrape annotations but serve no metrics", where)
			}
		}
	}
	on := map[string][]*appsv1.Deployment{
		"deploy/examples/mock-driver-metrics": deployments(t, kustomize(t, "deploy/examples/mock-driver-metrics")),
		"chart csiAttacher.httpEndpoint": deployments(t, mustHelmTemplate(t, "drv", map[string]any{
			"driver": map[string]any{"enabled": true}, "csiAttacher": map[string]any{"httpEndpoint": true}})),
	}
	for where, ds := range on {
		cs := attacherContainers(ds)
		if len(cs) != 1 {
			t.Fatalf("%s: %d csi-attacher containers, want 1", where, len(cs))
		}
		for name, c := range cs {
			if !slices.Contains(c.Args, "--http-endpoint=:8080") || len(c.Ports) != 1 || c.Ports[0].ContainerPort != 8080 || c.LivenessProbe == nil {
				t.Errorf("%s %s: args %v ports %v probe %v, want --http-endpoint=:8080 with port 8080 and the leader-election probe", where, name, c.Args, c.Ports, c.LivenessProbe)
			}
		}
		for _, d := range ds {
			// The chart says where to scrape with annotations; the example
			// with a PodMonitor (TestPodMonitorsScrapeNamedPortsOfTheirPods).
			if where == "chart csiAttacher.httpEndpoint" && d.Name == "csi-mock-controller" && d.Spec.Template.Annotations["prometheus.io/port"] != "8080" {
				t.Errorf("%s: driver Pods annotations %v, want the scrape annotations on port 8080", where, d.Spec.Template.Annotations)
			}
		}
	}
}
