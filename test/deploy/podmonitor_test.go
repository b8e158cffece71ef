package deploy_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"
)

// podMonitor is the part of a monitoring.coreos.com/v1 PodMonitor the
// checks below read (field names of the Prometheus Operator's Go types).
type podMonitor struct {
	Metadata metav1.ObjectMeta `json:"metadata"`
	Spec     struct {
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector struct {
			Any        bool     `json:"any"`
			MatchNames []string `json:"matchNames"`
		} `json:"namespaceSelector"`
		PodMetricsEndpoints []struct {
			Port string `json:"port"`
			Path string `json:"path"`
		} `json:"podMetricsEndpoints"`
	} `json:"spec"`
}

func podMonitors(t *testing.T, objs []*unstructured.Unstructured) []podMonitor {
	t.Helper()
	var out []podMonitor
	for _, o := range objs {
		if o.GetKind() != "PodMonitor" {
			continue
		}
		raw, err := o.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		var pm podMonitor
		if err := yaml.UnmarshalStrict(raw, &pm, yaml.DisallowUnknownFields); err != nil && !strings.Contains(err.Error(), "unknown field") {
			t.Fatalf("PodMonitor %s: %v", o.GetName(), err)
		}
		out = append(out, pm)
	}
	return out
}

// Every PodMonitor shipped in deploy/ scrapes something real: its selector
// picks the Pods of a Deployment in its namespace, and each endpoint's port
// is a named port of those Pods on which a container serves /metrics (its
// --http-endpoint listens on that port, on every interface). The overlay
// for Prometheus without the Operator ships no PodMonitor, and the
// Operator's overlay no scrape annotations (no target scraped twice).
func TestPodMonitorsScrapeNamedPortsOfTheirPods(t *testing.T) {
	found := 0
	for _, dir := range kustomizations(t) {
		objs := kustomize(t, dir)
		if dir == "deploy/overlays/prometheus-scrape" && len(podMonitors(t, objs)) != 0 {
			t.Errorf("%s ships a PodMonitor: it is the overlay for Prometheus without the Operator", dir)
		}
		found += checkPodMonitors(t, dir, objs)
	}
	if found < 2 {
		t.Errorf("found %d PodMonitors in deploy/, want the controller's and the example driver's", found)
	}
}

// checkPodMonitors checks the PodMonitors among objs (rendered from
// where): each selects the Pods of a Deployment among objs and names a port
// of theirs that serves /metrics, and no Deployment beside them carries
// scrape annotations. It returns how many there are.
func checkPodMonitors(t *testing.T, where string, objs []*unstructured.Unstructured) int {
	t.Helper()
	pms := podMonitors(t, objs)
	ds := deployments(t, objs)
	if len(pms) > 0 {
		for _, d := range ds {
			if _, ok := d.Spec.Template.Annotations["prometheus.io/scrape"]; ok {
				t.Errorf("%s: Deployment %s carries scrape annotations beside a PodMonitor (scraped twice)", where, d.Name)
			}
		}
	}
	for _, pm := range pms {
		where := fmt.Sprintf("%s: PodMonitor %s/%s", where, pm.Metadata.Namespace, pm.Metadata.Name)
		namespaces := pm.Spec.NamespaceSelector.MatchNames
		if len(namespaces) == 0 && !pm.Spec.NamespaceSelector.Any {
			namespaces = []string{pm.Metadata.Namespace}
		}
		sel, err := metav1.LabelSelectorAsSelector(&pm.Spec.Selector)
		if err != nil || sel.Empty() {
			t.Errorf("%s: selector %v selects %s", where, pm.Spec.Selector, map[bool]string{true: "every Pod", false: "nothing valid"}[err == nil])
			continue
		}
		if len(pm.Spec.PodMetricsEndpoints) == 0 {
			t.Errorf("%s: no podMetricsEndpoints", where)
		}
		selected := 0
		for _, d := range ds {
			if !slices.Contains(namespaces, d.Namespace) && !pm.Spec.NamespaceSelector.Any || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
				continue
			}
			selected++
			for _, ep := range pm.Spec.PodMetricsEndpoints {
				if !servesMetricsOn(d.Spec.Template.Spec.Containers, ep.Port) {
					t.Errorf("%s: Deployment %s has no container serving /metrics on a port named %q", where, d.Name, ep.Port)
				}
			}
		}
		if selected == 0 {
			t.Errorf("%s selects no Deployment's Pods in %v", where, namespaces)
		}
	}
	return len(pms)
}

// servesMetricsOn: a container declares the named port and listens on it
// for metrics on every interface (--http-endpoint=:<port>).
func servesMetricsOn(cs []v1.Container, name string) bool {
	for _, c := range cs {
		for _, p := range c.Ports {
			if p.Name == name && slices.Contains(c.Args, "--http-endpoint=:"+strconv.Itoa(int(p.ContainerPort))) {
				return true
			}
		}
	}
	return false
}

// operatorCRDs are the Prometheus Operator's CRDs the manifests use, by
// kind: the files in testdata, each created once per test process.
var operatorCRDs = map[string]*operatorCRD{
	"PodMonitor":     {file: "podmonitors.monitoring.coreos.com.yaml"},
	"PrometheusRule": {file: "prometheusrules.monitoring.coreos.com.yaml"},
}

type operatorCRD struct {
	file string
	once sync.Once
	err  error
}

// installOperatorCRDs creates the CRD (testdata) of each Operator kind among
// objs once, and waits until the API server serves it, so that the dry-run
// checks those objects against its schema.
func installOperatorCRDs(ctx context.Context, t *testing.T, client dynamic.Interface, objs []*unstructured.Unstructured) error {
	t.Helper()
	for kind, crd := range operatorCRDs {
		if !slices.ContainsFunc(objs, func(o *unstructured.Unstructured) bool { return o.GetKind() == kind }) {
			continue
		}
		crd.once.Do(func() { crd.err = installCRD(ctx, t, client, kind, crd.file) })
		if crd.err != nil {
			return crd.err
		}
	}
	return nil
}

func installCRD(ctx context.Context, t *testing.T, client dynamic.Interface, kind, file string) error {
	raw, err := os.ReadFile(filepath.Join(repoRoot(t), "test/deploy/testdata", file))
	if err != nil {
		return err
	}
	crd := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(raw, &crd.Object); err != nil {
		return err
	}
	gvr := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	if _, err := client.Resource(gvr).Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create the %s CRD: %w", kind, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, err := client.Resource(gvr).Get(ctx, crd.GetName(), metav1.GetOptions{})
		if err == nil {
			conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
			for _, c := range conds {
				m, _ := c.(map[string]any)
				if m["type"] == "Established" && m["status"] == "True" {
					return nil
				}
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the %s CRD is not Established after 30s (last error %v)", kind, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
