package latchlocal

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/latchcsi/latch/internal/testsupport"
)

// applyKustomization is `kubectl apply -k dir` on env: every object the
// kustomization renders is created, or, when it exists (latch-local's own
// CSIDriver), applied over it.
func applyKustomization(t *testing.T, ctx context.Context, env *Env, dir string) {
	t.Helper()
	resMap, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), filepath.Join("..", "..", dir))
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	cfg := env.Cluster.RESTConfig()
	m := &manifest{dyn: dynamic.NewForConfigOrDie(cfg)}
	m.mapper = restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(discovery.NewDiscoveryClientForConfigOrDie(cfg)))
	for _, res := range resMap.Resources() {
		obj, err := res.Map()
		if err != nil {
			t.Fatal(err)
		}
		m.objs = append(m.objs, &unstructured.Unstructured{Object: obj})
	}
	force := true
	for _, obj := range m.objs {
		ri := m.resource(t, obj)
		_, err := ri.Create(ctx, obj, metav1.CreateOptions{FieldManager: "kubectl-client-side-apply"})
		if apierrors.IsAlreadyExists(err) {
			data, merr := obj.MarshalJSON()
			if merr != nil {
				t.Fatal(merr)
			}
			_, err = ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{FieldManager: "kubectl", Force: &force})
		}
		if err != nil {
			t.Fatalf("kubectl apply -k %s: %s %s: %v", dir, obj.GetKind(), obj.GetName(), err)
		}
	}
}

// canILine is one `kubectl auth can-i` command of step 3 and the answer
// its comment gives.
type canILine struct {
	verb, resource, subresource, user string
	want                              bool
}

// step3CanI returns the `kubectl auth can-i` commands of
// getting-started's step 3 (continuation lines joined) with the answers
// their comments give ("# yes", "# no: ...").
func step3CanI(t *testing.T) []canILine {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "getting-started.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, step, _ := strings.Cut(string(doc), "## 3. Apply the deployment manifests")
	step, _, _ = strings.Cut(step, "\n## ")
	var out []canILine
	for _, cmd := range strings.Split(strings.ReplaceAll(step, "\\\n", " "), "\n") {
		if !strings.HasPrefix(cmd, "kubectl auth can-i ") {
			continue
		}
		words, comment, _ := strings.Cut(cmd, "#")
		f := strings.Fields(strings.TrimPrefix(words, "kubectl auth can-i "))
		c := canILine{verb: f[0], resource: f[1]}
		if c.resource != "volumeattachments" {
			t.Fatalf("getting-started step 3: %q: the test knows the group of volumeattachments only", cmd)
		}
		for _, flag := range f[2:] {
			if v, ok := strings.CutPrefix(flag, "--subresource="); ok {
				c.subresource = v
			} else if v, ok := strings.CutPrefix(flag, "--as="); ok {
				c.user = v
			} else {
				t.Fatalf("getting-started step 3: %q: unknown flag %s", cmd, flag)
			}
		}
		switch answer := strings.Fields(strings.TrimSpace(comment)); {
		case len(answer) > 0 && answer[0] == "yes":
			c.want = true
		case len(answer) > 0 && strings.TrimSuffix(answer[0], ":") == "no":
		default:
			t.Fatalf("getting-started step 3: %q: the comment says neither yes nor no", cmd)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		t.Fatal("getting-started step 3 has no kubectl auth can-i command")
	}
	return out
}

// gettingStartedStep3 runs step 3 on env: both kustomizations applied,
// each `kubectl auth can-i` answers what the doc says (asked as kubectl
// asks it with --as: the ServiceAccount's user and groups), and the
// Deployments' Pods run on the hollow nodes (the fake runtime's).
func gettingStartedStep3(t *testing.T, ctx context.Context, env *Env) {
	t.Helper()
	applyKustomization(t, ctx, env, "deploy/overlays/prometheus-scrape")
	applyKustomization(t, ctx, env, "deploy/examples/mock-driver")
	for _, c := range step3CanI(t) {
		ns, _, _ := strings.Cut(strings.TrimPrefix(c.user, "system:serviceaccount:"), ":")
		what := "can-i " + c.verb + " " + c.resource + "/" + c.subresource + " as " + c.user
		testsupport.Eventually(t, ctx, 30*time.Second, what+" answers as the doc says", func(ctx context.Context) (bool, error) {
			sar, err := env.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User: c.user, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
				ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: "default", Verb: c.verb, Group: "storage.k8s.io", Resource: c.resource, Subresource: c.subresource},
			}}, metav1.CreateOptions{})
			return err == nil && sar.Status.Allowed == c.want, err
		})
	}
	for _, d := range []struct{ ns, name string }{{"kube-system", "latch-attachdetach-controller"}, {"latch-system", "csi-mock-controller"}} {
		testsupport.Eventually(t, ctx, 2*time.Minute, "the Pods of Deployment "+d.ns+"/"+d.name+" Running on the hollow nodes", func(ctx context.Context) (bool, error) {
			dep, err := env.Client.AppsV1().Deployments(d.ns).Get(ctx, d.name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			pods, err := env.Client.CoreV1().Pods(d.ns).List(ctx, metav1.ListOptions{LabelSelector: metav1.FormatLabelSelector(dep.Spec.Selector)})
			if err != nil {
				return false, err
			}
			running := 0
			for _, p := range pods.Items {
				if p.Status.Phase == v1.PodRunning {
					running++
				}
			}
			return dep.Spec.Replicas != nil && running == int(*dep.Spec.Replicas), nil
		})
	}
}
