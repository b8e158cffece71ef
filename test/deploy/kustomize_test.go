package deploy_test

import (
	"context"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// kustomizations lists every directory under deploy/ with a
// kustomization.yaml, relative to the repository root.
func kustomizations(t *testing.T) []string {
	t.Helper()
	root := repoRoot(t)
	var dirs []string
	err := filepath.WalkDir(filepath.Join(root, "deploy"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && d.Name() == "kustomization.yaml" {
			rel, err := filepath.Rel(root, filepath.Dir(path))
			if err != nil {
				return err
			}
			dirs = append(dirs, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return dirs
}

// kustomize renders one kustomization the way `kubectl apply -k` does.
func kustomize(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	resMap, err := k.Run(filesys.MakeFsOnDisk(), filepath.Join(repoRoot(t), dir))
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	out, err := resMap.AsYaml()
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	objs, err := decodeYAML(out)
	if err != nil {
		t.Fatalf("kustomize build %s: decode output: %v", dir, err)
	}
	return objs
}

func TestEveryKustomizationPassesServerSideDryRun(t *testing.T) {
	dirs := kustomizations(t)
	for _, want := range []string{"deploy/csi-attacher", "deploy/attachdetach-controller", "deploy/examples/mock-driver", "deploy/overlays/prometheus-scrape", "deploy/overlays/prometheus-operator", "deploy/examples/mock-driver-metrics"} {
		if !slices.Contains(dirs, want) {
			t.Errorf("kustomization %s is missing (found %v)", want, dirs)
		}
	}
	for _, dir := range dirs {
		t.Run(dir, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			objs := kustomize(t, dir)
			if len(objs) == 0 {
				t.Fatalf("%s renders no objects", dir)
			}
			for _, d := range deployments(t, objs) {
				for _, p := range securityProblems(d) {
					t.Error(p)
				}
			}
			for _, err := range dryRunApply(ctx, t, objs) {
				t.Errorf("server-side dry-run rejected %v", err)
			}
		})
	}
}

// The bases carry exactly the RBAC each binary needs, bound to the
// ServiceAccount its Pods run as.
func TestBasesBindTheirRBACToTheServiceAccountTheirPodsUse(t *testing.T) {
	cases := []struct {
		dir, deployment, serviceAccount, clusterRole string
	}{
		{"deploy/attachdetach-controller", "latch-attachdetach-controller", "latch-attachdetach-controller", "latch-attachdetach-controller"},
		{"deploy/examples/mock-driver", "csi-mock-controller", "csi-attacher", "latch-csi-attacher"},
	}
	for _, c := range cases {
		t.Run(c.dir, func(t *testing.T) {
			objs := kustomize(t, c.dir)
			var sa, crb bool
			var ns string
			for _, d := range deployments(t, objs) {
				if d.Name == c.deployment {
					ns = d.Namespace
					if got := d.Spec.Template.Spec.ServiceAccountName; got != c.serviceAccount {
						t.Errorf("Deployment %s runs as ServiceAccount %q, want %q", d.Name, got, c.serviceAccount)
					}
				}
			}
			if ns == "" {
				t.Fatalf("no Deployment %s in %s", c.deployment, c.dir)
			}
			for _, o := range objs {
				switch o.GetKind() {
				case "ServiceAccount":
					sa = sa || (o.GetName() == c.serviceAccount && o.GetNamespace() == ns)
				case "ClusterRoleBinding":
					if o.GetName() != c.clusterRole {
						continue
					}
					subjects, _, _ := unstructured.NestedSlice(o.Object, "subjects")
					for _, s := range subjects {
						m, _ := s.(map[string]any)
						crb = crb || (m["kind"] == "ServiceAccount" && m["name"] == c.serviceAccount && m["namespace"] == ns)
					}
				}
			}
			if !sa {
				t.Errorf("no ServiceAccount %s/%s", ns, c.serviceAccount)
			}
			if !crb {
				t.Errorf("ClusterRoleBinding %s does not bind ServiceAccount %s/%s", c.clusterRole, ns, c.serviceAccount)
			}
		})
	}
}

func TestPrometheusOverlayAnnotatesEveryPodTemplate(t *testing.T) {
	objs := kustomize(t, "deploy/overlays/prometheus-scrape")
	ds := deployments(t, objs)
	if len(ds) != 1 || ds[0].Name != "latch-attachdetach-controller" {
		t.Fatalf("overlay renders Deployments %v, want the controller's alone (no example driver)", deploymentNames(ds))
	}
	for _, d := range ds {
		a := d.Spec.Template.Annotations
		if a["prometheus.io/scrape"] != "true" || a["prometheus.io/port"] != "8080" || a["prometheus.io/path"] != "/metrics" {
			t.Errorf("Deployment %s Pod annotations = %v, want prometheus.io scrape/port/path", d.Name, a)
		}
	}
	// The bases themselves stay free of scrape annotations.
	for _, dir := range []string{"deploy/attachdetach-controller", "deploy/examples/mock-driver"} {
		for _, d := range deployments(t, kustomize(t, dir)) {
			if _, ok := d.Spec.Template.Annotations["prometheus.io/scrape"]; ok {
				t.Errorf("%s: Deployment %s already has scrape annotations; they belong in the overlay", dir, d.Name)
			}
		}
	}
}

// The checks above can fail: the API server rejects a broken copy of a
// real manifest, and the security baseline catches a weakened container.
func TestChecksRejectBrokenManifests(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	objs := kustomize(t, "deploy/examples/mock-driver")
	var dep *unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "Deployment" {
			dep = o.DeepCopy()
		}
	}
	if dep == nil {
		t.Fatal("no Deployment in deploy/examples/mock-driver")
	}
	broken := func(mutate func(containers []any)) *unstructured.Unstructured {
		d := dep.DeepCopy()
		containers, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
		mutate(containers)
		if err := unstructured.SetNestedSlice(d.Object, containers, "spec", "template", "spec", "containers"); err != nil {
			t.Fatal(err)
		}
		return d
	}
	for _, c := range []struct {
		what, want string
		mutate     func([]any)
	}{
		{"a value the API does not allow", "imagePullPolicy", func(cs []any) { cs[0].(map[string]any)["imagePullPolicy"] = "Sometimes" }},
		{"an unknown field", "volumeMountz", func(cs []any) { cs[1].(map[string]any)["volumeMountz"] = []any{} }},
	} {
		errs := dryRunApply(ctx, t, []*unstructured.Unstructured{broken(c.mutate)})
		if len(errs) != 1 || !strings.Contains(errs[0].Error(), c.want) {
			t.Errorf("%s: dry-run errors = %v, want one rejection naming %s", c.what, errs, c.want)
		}
	}
	weak := broken(func(cs []any) { cs[1].(map[string]any)["securityContext"] = map[string]any{} })
	problems := securityProblems(deployments(t, []*unstructured.Unstructured{weak})[0])
	if len(problems) != 3 {
		t.Errorf("security problems = %q, want 3 for the emptied securityContext (writable root, escalation, capabilities)", problems)
	}
}
