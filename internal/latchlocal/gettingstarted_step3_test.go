package latchlocal

import (
	"context"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/testsupport"
)

// canILine is one `kubectl auth can-i` command of getting-started's step 3
// and the answer its comment gives.
type canILine struct {
	verb, resource, subresource, user string
	want                              bool
}

// parseCanI reads a `kubectl auth can-i` command of step 3 (continuation
// lines joined) and the answer its comment gives ("# yes", "# no: ...").
func parseCanI(t *testing.T, cmd string) canILine {
	t.Helper()
	words, comment, _ := strings.Cut(cmd, "#")
	f := strings.Fields(strings.TrimPrefix(words, "kubectl auth can-i "))
	if len(f) < 2 {
		t.Fatalf("getting-started step 3: %q: want a verb and a resource", cmd)
	}
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
	return c
}

// waitCanI waits until the API server's authorizer gives c's answer (the
// RBAC just applied takes effect within moments), asked as kubectl asks
// it with --as: the ServiceAccount's user and groups.
func waitCanI(t *testing.T, ctx context.Context, env *Env, c canILine) {
	t.Helper()
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

// waitDeploymentsRunning waits until step 3's Deployments have their Pods
// Running on the hollow nodes (the fake runtime's), as the doc says.
func waitDeploymentsRunning(t *testing.T, ctx context.Context, env *Env) {
	t.Helper()
	for _, d := range []struct{ ns, name string }{{"kube-system", "latch-attachdetach-controller"}, {"latch-system", "csi-mock-controller"}} {
		testsupport.Eventually(t, ctx, 2*time.Minute, "the Pods of Deployment "+d.ns+"/"+d.name+" Running on the hollow nodes", func(ctx context.Context) (bool, error) {
			dep, err := env.Client.AppsV1().Deployments(d.ns).Get(ctx, d.name, metav1.GetOptions{})
			if err != nil {
				return false, nil
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
