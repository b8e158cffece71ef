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
		pms := podMonitors(t, objs)
		ds := deployments(t, objs)
		if dir == "deploy/overlays/prometheus-scrape" && len(pms) != 0 {
			t.Errorf("%s ships a PodMonitor: it is the overlay for Prometheus without the Operator", dir)
		}
		if len(pms) > 0 {
			for _, d := range ds {
				if _, ok := d.Spec.Template.Annotations["prometheus.io/scrape"]; ok {
					t.Errorf("%s: Deployment %s carries scrape annotations beside a PodMonitor (scraped twice)", dir, d.Name)
				}
			}
		}
		for _, pm := range pms {
			found++
			where := fmt.Sprintf("%s: PodMonitor %s/%s", dir, pm.Metadata.Namespace, pm.Metadata.Name)
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
	}
	if found < 2 {
		t.Errorf("found %d PodMonitors in deploy/, want the controller's and the example driver's", found)
	}
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

var podMonitorCRD struct {
	once sync.Once
	err  error
}

// installPodMonitorCRD creates the PodMonitor CRD (testdata) once, and waits
// until the API server serves it, so that the dry-run can check
// PodMonitors against its schema.
func installPodMonitorCRD(ctx context.Context, t *testing.T, client dynamic.Interface) error {
	t.Helper()
	podMonitorCRD.once.Do(func() {
		raw, err := os.ReadFile(filepath.Join(repoRoot(t), "test/deploy/testdata/podmonitors.monitoring.coreos.com.yaml"))
		if err != nil {
			podMonitorCRD.err = err
			return
		}
		crd := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(raw, &crd.Object); err != nil {
			podMonitorCRD.err = err
			return
		}
		gvr := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
		if _, err := client.Resource(gvr).Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			podMonitorCRD.err = fmt.Errorf("create the PodMonitor CRD: %w", err)
			return
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			got, err := client.Resource(gvr).Get(ctx, crd.GetName(), metav1.GetOptions{})
			if err == nil {
				conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
				for _, c := range conds {
					m, _ := c.(map[string]any)
					if m["type"] == "Established" && m["status"] == "True" {
						return
					}
				}
			}
			if time.Now().After(deadline) {
				podMonitorCRD.err = fmt.Errorf("the PodMonitor CRD is not Established after 30s (last error %v)", err)
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	return podMonitorCRD.err
}
