package deploy_test

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
)

// checkControllerHA fails unless the controller's Deployment runs at least
// two replicas at a system priority, prefers to put them on different
// nodes and spreads them over zones, and a PodDisruptionBudget selecting
// exactly its Pods keeps one available: so one node failure or drain never
// takes the leader and its standby together.
func checkControllerHA(t *testing.T, where string, objs []*unstructured.Unstructured) {
	t.Helper()
	d := checkReplicasHA(t, where, objs, "latch-attachdetach-controller")
	if d.Spec.Template.Spec.PriorityClassName != "system-cluster-critical" {
		t.Errorf("%s: priorityClassName = %q, want system-cluster-critical", where, d.Spec.Template.Spec.PriorityClassName)
	}
}

// checkReplicasHA is checkControllerHA without the priority, for any
// Deployment whose replicas elect a leader (a driver's, with csi-attacher).
func checkReplicasHA(t *testing.T, where string, objs []*unstructured.Unstructured, name string) *appsv1.Deployment {
	t.Helper()
	var d *appsv1.Deployment
	for _, x := range deployments(t, objs) {
		if x.Name == name {
			d = x
		}
	}
	if d == nil {
		t.Fatalf("%s: no %s Deployment", where, name)
	}
	podLabels := labels.Set(d.Spec.Template.Labels)
	if d.Spec.Replicas == nil || *d.Spec.Replicas < 2 {
		t.Errorf("%s: replicas = %v, want at least 2", where, d.Spec.Replicas)
	}

	apart := false
	if a := d.Spec.Template.Spec.Affinity; a != nil && a.PodAntiAffinity != nil {
		for _, term := range a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
			if term.PodAffinityTerm.TopologyKey == "kubernetes.io/hostname" && selects(t, term.PodAffinityTerm.LabelSelector, podLabels) {
				apart = true
			}
		}
	}
	if !apart {
		t.Errorf("%s: no pod anti-affinity on kubernetes.io/hostname selecting the Pods of %s", where, name)
	}
	spread := false
	for _, c := range d.Spec.Template.Spec.TopologySpreadConstraints {
		if c.TopologyKey == "topology.kubernetes.io/zone" && selects(t, c.LabelSelector, podLabels) {
			spread = true
		}
	}
	if !spread {
		t.Errorf("%s: no topology spread over topology.kubernetes.io/zone selecting the Pods of %s", where, name)
	}

	var pdbs []*policyv1.PodDisruptionBudget
	for _, pdb := range objectsOf[policyv1.PodDisruptionBudget](t, objs, "PodDisruptionBudget") {
		if pdb.Namespace == d.Namespace && selects(t, pdb.Spec.Selector, podLabels) {
			pdbs = append(pdbs, pdb)
		}
	}
	if len(pdbs) != 1 {
		t.Fatalf("%s: %d PodDisruptionBudgets select the Pods of %s in %s, want 1", where, len(pdbs), name, d.Namespace)
	}
	if m := pdbs[0].Spec.MinAvailable; m == nil || m.IntValue() != 1 {
		t.Errorf("%s: PodDisruptionBudget minAvailable = %v, want 1 (one replica evicted at a time)", where, m)
	}
	return d
}

func selects(t *testing.T, ls *metav1.LabelSelector, podLabels labels.Set) bool {
	t.Helper()
	if ls == nil {
		return false
	}
	sel, err := metav1.LabelSelectorAsSelector(ls)
	if err != nil {
		t.Fatalf("label selector %v: %v", ls, err)
	}
	return !sel.Empty() && sel.Matches(podLabels)
}

func TestControllerReplicasAreKeptApartAndDrainedOneAtATime(t *testing.T) {
	checkControllerHA(t, "deploy/attachdetach-controller", kustomize(t, "deploy/attachdetach-controller"))
	checkControllerHA(t, "chart defaults", mustHelmTemplate(t, "kube-system", nil))

	// The chart's switch turns the budget off, and the check notices.
	objs := mustHelmTemplate(t, "kube-system", map[string]any{
		"attachdetachController": map[string]any{"podDisruptionBudget": map[string]any{"enabled": false}},
	})
	for _, o := range objs {
		if o.GetKind() == "PodDisruptionBudget" {
			t.Errorf("podDisruptionBudget.enabled=false still renders PodDisruptionBudget %s", o.GetName())
		}
	}
}
