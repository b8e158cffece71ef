package deploy_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
)

// grants flattens every Role and ClusterRole rule among objs into
// "group/resource verb" strings, sorted and without duplicates.
func grants(t *testing.T, objs []*unstructured.Unstructured) []string {
	t.Helper()
	var out []string
	for _, o := range objs {
		if o.GetKind() != "ClusterRole" && o.GetKind() != "Role" {
			continue
		}
		var role rbacv1.ClusterRole
		if err := k8sruntime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &role); err != nil {
			t.Fatalf("%s %s: %v", o.GetKind(), o.GetName(), err)
		}
		for _, r := range role.Rules {
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					for _, v := range r.Verbs {
						out = append(out, o.GetKind()+" "+g+"/"+res+" "+v)
					}
				}
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// The Helm chart grants each binary exactly what deploy/'s RBAC grants —
// the rules the RBAC-only end-to-end runs prove sufficient — no more, no
// less, so the two ways of installing cannot drift apart.
func TestHelmChartRBACMatchesDeployRBAC(t *testing.T) {
	objs := mustHelmTemplate(t, "kube-system", nil)
	for _, c := range []struct {
		binary, rbacFile, chartRole string
	}{
		{"attachdetach-controller", "deploy/attachdetach-controller/rbac.yaml", "latch-attachdetach-controller"},
		{"csi-attacher", "deploy/csi-attacher/rbac.yaml", "latch-csi-attacher"},
	} {
		t.Run(c.binary, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(repoRoot(t), c.rbacFile))
			if err != nil {
				t.Fatal(err)
			}
			fromDeploy, err := decodeYAML(data)
			if err != nil {
				t.Fatal(err)
			}
			var fromChart []*unstructured.Unstructured
			for _, o := range objs {
				if (o.GetKind() == "ClusterRole" || o.GetKind() == "Role") && strings.HasPrefix(o.GetName(), c.chartRole) {
					fromChart = append(fromChart, o)
				}
			}
			want, got := grants(t, fromDeploy), grants(t, fromChart)
			if len(want) == 0 {
				t.Fatalf("%s grants nothing", c.rbacFile)
			}
			if !slices.Equal(got, want) {
				t.Errorf("chart grants differ from %s\nchart:  %q\ndeploy: %q", c.rbacFile, got, want)
			}
		})
	}
}
