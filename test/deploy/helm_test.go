package deploy_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/Masterminds/semver/v3"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/latchcsi/latch/internal/version"
)

const chartDir = "charts/latch"

// helmTemplate renders the chart like `helm template latch charts/latch
// --namespace <namespace> --set ...`, with the Kubernetes version of the
// in-process API server (the chart's kubeVersion constraint must accept
// it). Values are merged over values.yaml.
func helmTemplate(t *testing.T, namespace string, vals map[string]any) ([]*unstructured.Unstructured, error) {
	t.Helper()
	files, err := helmRender(t, namespace, vals)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	var objs []*unstructured.Unstructured
	for _, name := range names {
		if strings.HasSuffix(name, "NOTES.txt") || strings.HasPrefix(filepath.Base(name), "_") {
			continue
		}
		o, err := decodeYAML([]byte(files[name]))
		if err != nil {
			t.Fatalf("%s: rendered YAML does not parse: %v\n%s", name, err, files[name])
		}
		objs = append(objs, o...)
	}
	return objs, nil
}

// helmRender renders every template of the chart, as `helm install`
// does: the values are checked against values.schema.json on the way
// (chartutil.ToRenderValuesWithSchemaValidation, as the install action
// calls it without --skip-schema-validation). It returns the rendered
// files by name, NOTES.txt included.
func helmRender(t *testing.T, namespace string, vals map[string]any) (map[string]string, error) {
	t.Helper()
	ch, err := loader.Load(filepath.Join(repoRoot(t), chartDir))
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	kubeVersion := serverVersion(t)
	if !chartutil.IsCompatibleRange(ch.Metadata.KubeVersion, kubeVersion.Version) {
		t.Fatalf("chart kubeVersion %q does not accept the API server's %s", ch.Metadata.KubeVersion, kubeVersion.Version)
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = kubeVersion
	const skipSchemaValidation = false
	rv, err := chartutil.ToRenderValuesWithSchemaValidation(ch, vals, chartutil.ReleaseOptions{Name: "latch", Namespace: namespace, Revision: 1, IsInstall: true}, caps, skipSchemaValidation)
	if err != nil {
		return nil, err
	}
	// Strict: a template that reads a value values.yaml does not define
	// fails instead of rendering an empty string.
	return engine.Engine{Strict: true}.Render(ch, rv)
}

// serverVersion is the in-process API server's Kubernetes version. A
// server built from Go modules reports no version of its own
// (v0.0.0-master), so the version of the k8s.io/kubernetes module it is
// built from (go.mod) stands in.
func serverVersion(t *testing.T) chartutil.KubeVersion {
	t.Helper()
	info, err := cluster.Client().Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	v := info.GitVersion
	if _, err := semver.NewVersion(v); err != nil || strings.HasPrefix(v, "v0.0.0") {
		goMod, err := os.ReadFile(filepath.Join(repoRoot(t), "go.mod"))
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`(?m)^\s*k8s\.io/kubernetes (v\S+)`).FindSubmatch(goMod)
		if m == nil {
			t.Fatal("go.mod does not require k8s.io/kubernetes")
		}
		v = string(m[1])
	}
	sv, err := semver.NewVersion(v)
	if err != nil {
		t.Fatalf("API server version %q: %v", v, err)
	}
	return chartutil.KubeVersion{Version: "v" + sv.String(), Major: fmt.Sprint(sv.Major()), Minor: fmt.Sprint(sv.Minor())}
}

func mustHelmTemplate(t *testing.T, namespace string, vals map[string]any) []*unstructured.Unstructured {
	t.Helper()
	objs, err := helmTemplate(t, namespace, vals)
	if err != nil {
		t.Fatalf("render chart: %v", err)
	}
	return objs
}

// valueSets are the combinations the chart README describes.
var valueSets = []struct {
	name      string
	namespace string
	values    map[string]any
}{
	{"defaults: controller and attacher RBAC", "kube-system", nil},
	{"driver with the attacher sidecar", "latch-helm-driver", map[string]any{
		"attachdetachController": map[string]any{"enabled": false},
		"driver":                 map[string]any{"enabled": true},
	}},
	{"everything, no scrape annotations, json logs", "latch-helm-all", map[string]any{
		"metrics":                map[string]any{"podAnnotations": false},
		"attachdetachController": map[string]any{"loggingFormat": "json", "extraArgs": []any{"--reconcile-sync=30s"}, "leaderElection": false},
		"csiAttacher":            map[string]any{"readSecrets": false, "loggingFormat": "json", "extraArgs": []any{"--default-fstype=ext4"}},
		"driver":                 map[string]any{"enabled": true, "csiDriver": map[string]any{"name": "all.csi.latch.dev"}},
	}},
	{"Prometheus Operator: PodMonitors and PrometheusRule", "latch-helm-monitoring", map[string]any{
		"metrics":                map[string]any{"podMonitor": map[string]any{"enabled": true}, "prometheusRule": map[string]any{"enabled": true}},
		"attachdetachController": map[string]any{"httpEndpoint": true},
		"csiAttacher":            map[string]any{"httpEndpoint": true},
		"driver":                 map[string]any{"enabled": true},
	}},
	{"a real driver's container", "latch-helm-custom", map[string]any{
		"attachdetachController": map[string]any{"enabled": false},
		"driver": map[string]any{"enabled": true, "name": "example-controller", "csiDriver": map[string]any{"create": false},
			"container": map[string]any{"name": "example-driver", "image": "registry.example.com/example-csi:v1.2.3",
				"args": []any{"--endpoint=unix:///csi/csi.sock"}, "env": []any{map[string]any{"name": "LOG_LEVEL", "value": "info"}}}},
	}},
}

func TestHelmChartRendersAndPassesServerSideDryRun(t *testing.T) {
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			objs := mustHelmTemplate(t, vs.namespace, vs.values)
			if len(objs) == 0 {
				t.Fatal("no objects rendered")
			}
			for _, d := range deployments(t, objs) {
				for _, p := range securityProblems(d) {
					t.Error(p)
				}
			}
			// The release namespace exists before `helm install -n`.
			ns := &unstructured.Unstructured{}
			ns.SetAPIVersion("v1")
			ns.SetKind("Namespace")
			ns.SetName(vs.namespace)
			for _, err := range dryRunApply(ctx, t, append([]*unstructured.Unstructured{ns}, objs...)) {
				t.Errorf("server-side dry-run rejected %v", err)
			}
		})
	}
}

func container(t *testing.T, ds []*appsv1.Deployment, deployment, name string) v1.Container {
	t.Helper()
	for _, d := range ds {
		if d.Name != deployment {
			continue
		}
		for _, c := range d.Spec.Template.Spec.Containers {
			if c.Name == name {
				return c
			}
		}
	}
	t.Fatalf("no container %s in Deployment %s", name, deployment)
	return v1.Container{}
}

func TestHelmValuesReachTheManifests(t *testing.T) {
	t.Run("defaults install the controller and the attacher's RBAC, no driver", func(t *testing.T) {
		objs := mustHelmTemplate(t, "kube-system", nil)
		ds := deployments(t, objs)
		if len(ds) != 1 || ds[0].Name != "latch-attachdetach-controller" {
			t.Fatalf("Deployments = %v, want only latch-attachdetach-controller", deploymentNames(ds))
		}
		c := container(t, ds, "latch-attachdetach-controller", "attachdetach-controller")
		if c.Image != "ghcr.io/latchcsi/attachdetach-controller:"+version.Version {
			t.Errorf("image %q, want the chart appVersion tag", c.Image)
		}
		for _, want := range []string{"--leader-elect=true", "--leader-elect-resource-namespace=kube-system", "--http-endpoint=127.0.0.1:8080", "--health-endpoint=:8081", "--max-wait-for-unmount=6m"} {
			if !slices.Contains(c.Args, want) {
				t.Errorf("controller args %v lack %s", c.Args, want)
			}
		}
		// Metrics are on loopback by default (controller_endpoints_test.go).
		if _, ok := ds[0].Spec.Template.Annotations["prometheus.io/scrape"]; ok {
			t.Errorf("Pod annotations %v, want no prometheus.io/scrape while metrics are on loopback", ds[0].Spec.Template.Annotations)
		}
		if !hasObject(objs, "ClusterRole", "latch-csi-attacher-kube-system") || !hasObject(objs, "ServiceAccount", "csi-attacher") {
			t.Error("attacher RBAC (ClusterRole latch-csi-attacher-<namespace>, ServiceAccount csi-attacher) not rendered")
		}
	})
	t.Run("driver.enabled adds the sidecar next to csi-mock-driver on one socket", func(t *testing.T) {
		objs := mustHelmTemplate(t, "drv", map[string]any{
			"image":       map[string]any{"tag": "v0.3.0", "registry": "registry.example.com/latch"},
			"csiAttacher": map[string]any{"timeout": "45s", "workerThreads": 3, "leaderElection": false},
			"driver":      map[string]any{"enabled": true, "socketDir": "/run/csi", "socketName": "s.sock"},
		})
		ds := deployments(t, objs)
		side := container(t, ds, "csi-mock-controller", "csi-attacher")
		for _, want := range []string{"--csi-address=/run/csi/s.sock", "--timeout=45s", "--worker-threads=3", "--leader-election=false"} {
			if !slices.Contains(side.Args, want) {
				t.Errorf("sidecar args %v lack %s", side.Args, want)
			}
		}
		if side.LivenessProbe != nil {
			t.Error("sidecar has a /healthz/leader-election probe without leader election")
		}
		if side.Image != "registry.example.com/latch/csi-attacher:v0.3.0" {
			t.Errorf("sidecar image %q", side.Image)
		}
		drv := container(t, ds, "csi-mock-controller", "csi-driver")
		if drv.Image != "registry.example.com/latch/csi-mock-driver:v0.3.0" || !slices.Contains(drv.Args, "--csi-address=/run/csi/s.sock") {
			t.Errorf("driver container image %q args %v, want csi-mock-driver on the shared socket", drv.Image, drv.Args)
		}
		for _, d := range ds {
			if d.Name == "csi-mock-controller" && d.Spec.Template.Spec.ServiceAccountName != "csi-attacher" {
				t.Errorf("driver Pods run as %q, want the csi-attacher ServiceAccount", d.Spec.Template.Spec.ServiceAccountName)
			}
		}
		if !hasObject(objs, "CSIDriver", "mock.csi.latch.dev") {
			t.Error("CSIDriver mock.csi.latch.dev not rendered")
		}
	})
	t.Run("nodeStatusWorkers is passed only when set", func(t *testing.T) {
		hasFlag := func(args []string) bool {
			return slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--node-status-workers") })
		}
		c := container(t, deployments(t, mustHelmTemplate(t, "nsw", nil)), "latch-attachdetach-controller", "attachdetach-controller")
		if hasFlag(c.Args) {
			t.Errorf("default controller args %v pass --node-status-workers; want it left to the binary's default", c.Args)
		}
		objs := mustHelmTemplate(t, "nsw", map[string]any{"attachdetachController": map[string]any{"nodeStatusWorkers": 32}})
		c = container(t, deployments(t, objs), "latch-attachdetach-controller", "attachdetach-controller")
		if !slices.Contains(c.Args, "--node-status-workers=32") {
			t.Errorf("controller args %v lack --node-status-workers=32", c.Args)
		}
	})
	t.Run("readSecrets=false drops the Secret rule", func(t *testing.T) {
		for _, read := range []bool{true, false} {
			objs := mustHelmTemplate(t, "sec", map[string]any{"csiAttacher": map[string]any{"readSecrets": read}})
			if got := grantsSecrets(objs, "latch-csi-attacher-sec"); got != read {
				t.Errorf("readSecrets=%v: ClusterRole grants secrets = %v", read, got)
			}
		}
	})
	t.Run("driver without csiAttacher fails with a message", func(t *testing.T) {
		_, err := helmTemplate(t, "bad", map[string]any{"csiAttacher": map[string]any{"enabled": false}, "driver": map[string]any{"enabled": true}})
		if err == nil || !strings.Contains(err.Error(), "driver.enabled needs csiAttacher.enabled") {
			t.Errorf("render error = %v, want the driver.enabled/csiAttacher.enabled message", err)
		}
	})
}

func deploymentNames(ds []*appsv1.Deployment) []string {
	var out []string
	for _, d := range ds {
		out = append(out, d.Name)
	}
	return out
}

func hasObject(objs []*unstructured.Unstructured, kind, name string) bool {
	return slices.ContainsFunc(objs, func(o *unstructured.Unstructured) bool { return o.GetKind() == kind && o.GetName() == name })
}

func grantsSecrets(objs []*unstructured.Unstructured, clusterRole string) bool {
	for _, o := range objs {
		if o.GetKind() != "ClusterRole" || o.GetName() != clusterRole {
			continue
		}
		rules, _, _ := unstructured.NestedSlice(o.Object, "rules")
		for _, r := range rules {
			m, _ := r.(map[string]any)
			res, _ := m["resources"].([]any)
			if slices.Contains(res, any("secrets")) {
				return true
			}
		}
	}
	return false
}

// freeForm values are passed through to the manifests as they are; their
// keys are Kubernetes' and need no documentation of their own.
var freeForm = map[string]bool{"resources": true, "podSecurityContext": true, "containerSecurityContext": true,
	"nodeSelector": true, "tolerations": true, "affinity": true, "podAnnotations": true}

func valueKeys(prefix string, m map[string]any) []string {
	var out []string
	for k, v := range m {
		key := k
		if prefix != "" {
			key = prefix + "." + k
		}
		out = append(out, key)
		if sub, ok := v.(map[string]any); ok && !freeForm[k] {
			out = append(out, valueKeys(key, sub)...)
		}
	}
	return out
}

// chartValues is the chart's values.yaml.
func chartValues(t *testing.T) map[string]any {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var vals map[string]any
	if err := yaml.Unmarshal(raw, &vals); err != nil {
		t.Fatal(err)
	}
	return vals
}

// Every value values.yaml defines is documented in the chart's README.
func TestEveryHelmValueIsDocumented(t *testing.T) {
	dir := filepath.Join(repoRoot(t), chartDir)
	vals := chartValues(t)
	readme, err := os.ReadFile(filepath.Join(dir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	keys := valueKeys("", vals)
	if len(keys) < 20 {
		t.Fatalf("only %d value keys found; values.yaml did not parse as expected", len(keys))
	}
	for _, k := range keys {
		if !strings.Contains(string(readme), "`"+k+"`") {
			t.Errorf("value %s is not documented in %s/README.md", k, chartDir)
		}
	}
}
