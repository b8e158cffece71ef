package deploy_test

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/runner"
)

// shutdownBound is how long a latch container may take from SIGTERM to
// exit after a clean stop: its workers drain for at most
// runner.DefaultDrainTimeout, then it releases its Lease and sends its
// last events (kube.EventsStopTimeout).
const shutdownBound = runner.DefaultDrainTimeout + kube.EventsStopTimeout

// manifestSets is every set of manifests an operator can install: each
// kustomization under deploy/ and the chart with each value set.
func manifestSets(t *testing.T) map[string][]*unstructured.Unstructured {
	t.Helper()
	out := map[string][]*unstructured.Unstructured{}
	for _, dir := range kustomizations(t) {
		out[dir] = kustomize(t, dir)
	}
	for _, vs := range valueSets {
		out["chart: "+vs.name] = mustHelmTemplate(t, vs.namespace, vs.values)
	}
	out["chart: both endpoints on"] = mustHelmTemplate(t, "latch-helm-ports", map[string]any{
		"attachdetachController": map[string]any{"httpEndpoint": true},
		"csiAttacher":            map[string]any{"httpEndpoint": true},
		"driver":                 map[string]any{"enabled": true},
	})
	return out
}

// Every Pod template gives its containers more time between SIGTERM and
// SIGKILL than they take to drain and release their Lease: with the
// default 30 s, equal to the drain bound, the kubelet could kill a
// container before it let go of the Lease, and a standby waited out the
// lease duration.
func TestEveryPodTemplateOutlivesTheDrainBound(t *testing.T) {
	checked := 0
	for where, objs := range manifestSets(t) {
		for _, d := range deployments(t, objs) {
			grace := time.Duration(v1.DefaultTerminationGracePeriodSeconds) * time.Second
			if s := d.Spec.Template.Spec.TerminationGracePeriodSeconds; s != nil {
				grace = time.Duration(*s) * time.Second
			}
			if grace <= shutdownBound {
				t.Errorf("%s: Deployment %s has terminationGracePeriodSeconds %s, want more than the %s a latch container takes to drain and release its Lease",
					where, d.Name, grace, shutdownBound)
			}
			checked++
		}
	}
	if checked < 5 {
		t.Fatalf("checked only %d Pod templates", checked)
	}
}

// Every container port name is unique in its Pod and the csi-attacher
// sidecar's is not the generic "http" (other sidecars of a driver Pod use
// it); every probe and PodMonitor that names a port names one of the Pod.
func TestContainerPortNamesAreDistinctAndReferencesResolve(t *testing.T) {
	sidecars := 0
	for where, objs := range manifestSets(t) {
		for _, d := range deployments(t, objs) {
			spec := d.Spec.Template.Spec
			seen := map[string]string{}
			for _, c := range spec.Containers {
				for _, p := range c.Ports {
					if p.Name == "" {
						continue
					}
					if other, dup := seen[p.Name]; dup {
						t.Errorf("%s: Deployment %s: port name %q in containers %s and %s", where, d.Name, p.Name, other, c.Name)
					}
					seen[p.Name] = c.Name
					if c.Name == "csi-attacher" {
						sidecars++
						if p.Name == "http" {
							t.Errorf("%s: Deployment %s: the csi-attacher sidecar's port is named %q, which other sidecars use", where, d.Name, p.Name)
						}
					}
				}
				for _, probe := range []*v1.Probe{c.LivenessProbe, c.ReadinessProbe, c.StartupProbe} {
					if probe == nil || probe.HTTPGet == nil || probe.HTTPGet.Port.StrVal == "" {
						continue
					}
					if name := probe.HTTPGet.Port.StrVal; !hasPort(c, name) {
						t.Errorf("%s: Deployment %s container %s probes port %q, which it does not declare", where, d.Name, c.Name, name)
					}
				}
			}
		}
		for _, pm := range podMonitors(t, objs) {
			for _, ep := range pm.Spec.PodMetricsEndpoints {
				found := false
				for _, d := range deployments(t, objs) {
					if selects(t, &pm.Spec.Selector, labels.Set(d.Spec.Template.Labels)) {
						for _, c := range d.Spec.Template.Spec.Containers {
							found = found || hasPort(c, ep.Port)
						}
					}
				}
				if !found {
					t.Errorf("%s: PodMonitor %s scrapes port %q, which no Pod it selects declares", where, pm.Metadata.Name, ep.Port)
				}
			}
		}
	}
	if sidecars < 2 {
		t.Fatalf("saw the csi-attacher sidecar's port %d times; the value sets no longer switch it on", sidecars)
	}
}

func hasPort(c v1.Container, name string) bool {
	for _, p := range c.Ports {
		if p.Name == name {
			return true
		}
	}
	return false
}

// The driver Deployment with the csi-attacher sidecar is kept apart and
// drained one replica at a time, like the controller's: by default with
// more than one replica, not at all with one (a budget of minAvailable 1
// over one replica would block every drain), and switchable.
func TestDriverReplicasAreKeptApartAndDrainedOneAtATime(t *testing.T) {
	driver := func(extra map[string]any) map[string]any {
		d := map[string]any{"enabled": true}
		for k, v := range extra {
			d[k] = v
		}
		return map[string]any{"attachdetachController": map[string]any{"enabled": false}, "driver": d}
	}
	checkReplicasHA(t, "deploy/examples/mock-driver", kustomize(t, "deploy/examples/mock-driver"), "csi-mock-controller")
	checkReplicasHA(t, "chart with driver.enabled", mustHelmTemplate(t, "drv-ha", driver(nil)), "csi-mock-controller")

	pdbsOf := func(objs []*unstructured.Unstructured) []*policyv1.PodDisruptionBudget {
		return objectsOf[policyv1.PodDisruptionBudget](t, objs, "PodDisruptionBudget")
	}
	driverPod := func(objs []*unstructured.Unstructured) v1.PodSpec {
		for _, d := range deployments(t, objs) {
			if d.Name == "csi-mock-controller" {
				return d.Spec.Template.Spec
			}
		}
		t.Fatal("no driver Deployment")
		return v1.PodSpec{}
	}

	for _, tc := range []struct {
		name   string
		values map[string]any
	}{
		{"one replica", driver(map[string]any{"replicas": 1})},
		{"spread and budget switched off", driver(map[string]any{"spread": false, "podDisruptionBudget": map[string]any{"enabled": false}})},
	} {
		objs := mustHelmTemplate(t, "drv-ha", tc.values)
		if got := pdbsOf(objs); len(got) != 0 {
			t.Errorf("%s: PodDisruptionBudget %s rendered", tc.name, got[0].Name)
		}
		if pod := driverPod(objs); pod.Affinity != nil || len(pod.TopologySpreadConstraints) != 0 {
			t.Errorf("%s: affinity %+v, topologySpreadConstraints %+v; want none", tc.name, pod.Affinity, pod.TopologySpreadConstraints)
		}
	}

	// The controller's budget follows the same rule.
	objs := mustHelmTemplate(t, "ctrl-one", map[string]any{"attachdetachController": map[string]any{"replicas": 1}})
	if got := pdbsOf(objs); len(got) != 0 {
		t.Errorf("attachdetachController.replicas=1: PodDisruptionBudget %s rendered; it would block every drain", got[0].Name)
	}

	// An operator's own affinity is kept; the anti-affinity is added to it
	// unless it has its own. Own spread constraints replace the default.
	nodeAffinity := map[string]any{"nodeAffinity": map[string]any{"requiredDuringSchedulingIgnoredDuringExecution": map[string]any{
		"nodeSelectorTerms": []any{map[string]any{"matchExpressions": []any{map[string]any{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}}}}}}}
	ownSpread := []any{map[string]any{"maxSkew": 2, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule",
		"labelSelector": map[string]any{"matchLabels": map[string]any{"app.kubernetes.io/name": "csi-mock-controller"}}}}
	pod := driverPod(mustHelmTemplate(t, "drv-ha", driver(map[string]any{"affinity": nodeAffinity, "topologySpreadConstraints": ownSpread})))
	if pod.Affinity == nil || pod.Affinity.NodeAffinity == nil || pod.Affinity.PodAntiAffinity == nil {
		t.Errorf("own nodeAffinity: affinity %+v, want it kept and the podAntiAffinity added", pod.Affinity)
	}
	if len(pod.TopologySpreadConstraints) != 1 || pod.TopologySpreadConstraints[0].MaxSkew != 2 {
		t.Errorf("own topologySpreadConstraints: got %+v, want only the operator's", pod.TopologySpreadConstraints)
	}
}

// NOTES.txt says what the release installed and how to check it: its
// commands select the Pods the release runs and name the Leases the
// binaries hold; with the controller it reminds to turn
// kube-controller-manager's off.
func TestHelmNotesNameWhatWasInstalledAndHowToCheckIt(t *testing.T) {
	selector := regexp.MustCompile(`kubectl -n (\S+) get pods -l (\S+)`)
	lease := regexp.MustCompile(`kubectl -n (\S+) get lease (\S+)`)
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			files, err := helmRender(t, vs.namespace, vs.values)
			if err != nil {
				t.Fatal(err)
			}
			notes := files["latch/templates/NOTES.txt"]
			if notes == "" {
				t.Fatal("NOTES.txt rendered empty")
			}
			objs := mustHelmTemplate(t, vs.namespace, vs.values)
			ds := deployments(t, objs)
			for _, want := range []string{"release latch in namespace " + vs.namespace, "kubectl latch status", "--fail-pending-older=", "kubectl latch explain pod"} {
				if !strings.Contains(notes, want) {
					t.Errorf("NOTES.txt does not say %q:\n%s", want, notes)
				}
			}
			controller := hasObject(objs, "Deployment", "latch-attachdetach-controller")
			if got := strings.Contains(notes, "--controllers=*,-attachdetach"); got != controller {
				t.Errorf("NOTES.txt names --controllers=*,-attachdetach: %v, want %v (controller installed)\n%s", got, controller, notes)
			}
			// One pod selector per Deployment, matching its Pods.
			matches := selector.FindAllStringSubmatch(notes, -1)
			if len(matches) != len(ds) {
				t.Errorf("NOTES.txt has %d `get pods -l` commands for %d Deployments:\n%s", len(matches), len(ds), notes)
			}
			for _, m := range matches {
				sel, err := labels.Parse(m[2])
				if err != nil {
					t.Errorf("NOTES.txt selector %q: %v", m[2], err)
					continue
				}
				if m[1] != vs.namespace || !slices.ContainsFunc(ds, func(d *appsv1.Deployment) bool { return sel.Matches(labels.Set(d.Spec.Template.Labels)) }) {
					t.Errorf("NOTES.txt's `kubectl -n %s get pods -l %s` selects no Pods of the release", m[1], m[2])
				}
			}
			// The Leases are those the binaries take.
			var wantLeases []string
			if controller {
				wantLeases = append(wantLeases, "latch-attachdetach-controller")
			}
			for _, o := range objs {
				if o.GetKind() == "CSIDriver" {
					wantLeases = append(wantLeases, kube.LeaseName(o.GetName()))
				}
			}
			if d, _, _ := unstructured.NestedMap(vs.values, "driver"); d["enabled"] == true && !hasObjectKind(objs, "CSIDriver") {
				name, _, _ := unstructured.NestedString(d, "csiDriver", "name")
				if name == "" {
					name = "mock.csi.latch.dev" // values.yaml's
				}
				wantLeases = append(wantLeases, kube.LeaseName(name))
			}
			var gotLeases []string
			for _, m := range lease.FindAllStringSubmatch(notes, -1) {
				if m[1] != vs.namespace {
					t.Errorf("NOTES.txt looks for Lease %s in namespace %s, want %s", m[2], m[1], vs.namespace)
				}
				gotLeases = append(gotLeases, m[2])
			}
			if fmt.Sprint(gotLeases) != fmt.Sprint(wantLeases) {
				t.Errorf("NOTES.txt names Leases %v, want %v", gotLeases, wantLeases)
			}
		})
	}
}

func hasObjectKind(objs []*unstructured.Unstructured, kind string) bool {
	return slices.ContainsFunc(objs, func(o *unstructured.Unstructured) bool { return o.GetKind() == kind })
}
