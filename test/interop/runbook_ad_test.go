package interop

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/latchcsi/latch/internal/localcluster"
	"github.com/latchcsi/latch/internal/stack"
	"github.com/latchcsi/latch/internal/testsupport"
)

// deployControllerRBAC applies deploy/attachdetach-controller/rbac.yaml
// as written (what `kubectl apply -k deploy/attachdetach-controller`
// creates besides the Deployment and its PodDisruptionBudget), waits until
// the API server's authorizer grants every rule it binds, and returns the
// ServiceAccount's namespace and name.
func (w *world) deployControllerRBAC() (string, string) {
	w.t.Helper()
	data, err := testsupport.RepoFile("deploy/attachdetach-controller/rbac.yaml")
	if err != nil {
		w.t.Fatal(err)
	}
	objs, err := testsupport.ApplyRBAC(w.ctx, w.s.Client, data)
	if err != nil {
		w.t.Fatalf("deploy/attachdetach-controller/rbac.yaml: %v", err)
	}
	var saNS, saName string
	roles := map[string][]rbacv1.PolicyRule{} // "namespace/name", "/name" for a ClusterRole
	type binding struct{ ns, role string }
	var bindings []binding
	for _, obj := range objs {
		switch o := obj.(type) {
		case *v1.ServiceAccount:
			saNS, saName = o.Namespace, o.Name
		case *rbacv1.ClusterRole:
			roles["/"+o.Name] = o.Rules
		case *rbacv1.ClusterRoleBinding:
			bindings = append(bindings, binding{"", "/" + o.RoleRef.Name})
		case *rbacv1.Role:
			roles[o.Namespace+"/"+o.Name] = o.Rules
		case *rbacv1.RoleBinding:
			role := "/" + o.RoleRef.Name
			if o.RoleRef.Kind == "Role" {
				role = o.Namespace + role
			}
			bindings = append(bindings, binding{o.Namespace, role})
		}
	}
	if saName == "" || len(bindings) == 0 {
		w.t.Fatalf("deploy/attachdetach-controller/rbac.yaml declares ServiceAccount %q and %d bindings", saName, len(bindings))
	}
	user := "system:serviceaccount:" + saNS + ":" + saName
	for _, b := range bindings {
		for _, r := range roles[b.role] {
			for _, group := range r.APIGroups {
				for _, res := range r.Resources {
					for _, verb := range r.Verbs {
						resource, sub, _ := strings.Cut(res, "/")
						attrs := &authorizationv1.ResourceAttributes{Namespace: b.ns, Group: group, Resource: resource, Subresource: sub, Verb: verb}
						w.eventually(fmt.Sprintf("%s allowed to %s %s", user, verb, res), func(ctx context.Context) (bool, error) {
							sar, err := w.s.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
								Spec: authorizationv1.SubjectAccessReviewSpec{User: user, Groups: []string{"system:serviceaccounts", "system:authenticated"}, ResourceAttributes: attrs},
							}, metav1.CreateOptions{})
							return err == nil && sar.Status.Allowed, err
						})
					}
				}
			}
		}
	}
	return saNS, saName
}

// deployControllerArgs are the container's arguments in
// deploy/attachdetach-controller/deployment.yaml, with $(POD_NAMESPACE)
// the namespace the Deployment runs in (as the kubelet expands it) and
// the two listen addresses moved to free loopback ports; plus the
// kubeconfig a process outside the cluster needs. It returns the metrics
// endpoint too.
func (w *world) deployControllerArgs(namespace, kubeconfig string) (args []string, metrics string) {
	w.t.Helper()
	data, err := testsupport.RepoFile("deploy/attachdetach-controller/deployment.yaml")
	if err != nil {
		w.t.Fatal(err)
	}
	obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(data, nil, nil)
	if err != nil {
		w.t.Fatalf("deploy/attachdetach-controller/deployment.yaml: %v", err)
	}
	d, ok := obj.(*appsv1.Deployment)
	if !ok || len(d.Spec.Template.Spec.Containers) != 1 {
		w.t.Fatalf("deploy/attachdetach-controller/deployment.yaml: want a Deployment of one container, got %T", obj)
	}
	metrics = testsupport.FreeAddr(w.t)
	for _, a := range d.Spec.Template.Spec.Containers[0].Args {
		a = strings.ReplaceAll(a, "$(POD_NAMESPACE)", namespace)
		switch {
		case strings.HasPrefix(a, "--http-endpoint="):
			a = "--http-endpoint=" + metrics
		case strings.HasPrefix(a, "--health-endpoint="):
			a = "--health-endpoint=" + testsupport.FreeAddr(w.t)
		}
		args = append(args, a)
	}
	return append(args, "--kubeconfig="+kubeconfig), metrics
}

// TestMigrationRunbook_kcmControllerToLatchUnderTheDeployRBAC follows
// docs/migration.md's swap of kube-controller-manager's attach/detach
// controller for latch's, with exactly the rights deploy/ gives it, on
// nodes that heartbeat (hollow kubelets): kube-controller-manager
// --controllers=* attaches two volumes; it is restarted with
// --controllers=*,-attachdetach; deploy/attachdetach-controller's RBAC is
// applied and the controller starts with its Deployment's arguments,
// authenticated as its ServiceAccount (a token of it, nothing else). It
// keeps kcm's attachments (same VolumeAttachment, no second publish),
// detaches one of them and attaches new volumes, then detaches everything;
// the API server refuses none of its requests; kcm holds its Lease again,
// without its attach/detach controller.
func TestMigrationRunbook_kcmControllerToLatchUnderTheDeployRBAC(t *testing.T) {
	t.Parallel() // a world of its own, mostly waiting (worldsAtOnce)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	w := newHollowWorld(t, ctx)
	kcm := w.waitLease("kube-system", kcmLease, "held by kube-controller-manager", held)
	l := newWorkload(w, "runbook-ad")
	l.add(2)
	l.settled(nil, true)
	t.Logf("kube-controller-manager attached 2 volumes, %s after the start", time.Since(start).Round(time.Second))

	// 1. kube-controller-manager --controllers=*,-attachdetach.
	w.stop(w.kcm)
	w.kcm = w.startKCM(stack.ControllersExceptAttachDetach...)
	if !slices.Contains(w.kcm.args, "--controllers=*,-attachdetach") {
		t.Errorf("kube-controller-manager runs with %q, want --controllers=*,-attachdetach as the runbook says", w.kcm.args)
	}

	// 2. kubectl apply -k deploy/attachdetach-controller: its RBAC, and
	// the controller as its ServiceAccount with the Deployment's args.
	saNS, saName := w.deployControllerRBAC()
	cfg, err := w.s.Cluster.ServiceAccountConfig(ctx, saNS, saName)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := localcluster.WriteKubeconfig(kubeconfig, cfg); err != nil {
		t.Fatal(err)
	}
	args, metrics := w.deployControllerArgs(saNS, kubeconfig)
	w.ctrl = w.startLatch("attachdetach-controller-as-"+saName, "cmd/attachdetach-controller", metrics, args)
	ctrl := w.ctrl
	// Before the world stops it, also when a check below failed: no
	// request refused. A defer, not t.Cleanup: cleanups run after the
	// deferred cancel above, which kills the controller, so a cleanup's
	// scrape raced its exit.
	defer func() {
		samples, err := ctrl.Scrape(context.Background())
		if err != nil {
			t.Errorf("attachdetach-controller's metrics: %v", err)
			return
		}
		var refused []string
		for _, s := range samples.Find("rest_client_requests_total", nil) {
			if c := s.Labels["code"]; s.Value > 0 && (c == "401" || c == "403") {
				refused = append(refused, fmt.Sprintf("%s %s: %v", s.Labels["method"], c, s.Value))
			}
		}
		if len(refused) > 0 {
			t.Errorf("the API server refused requests of attachdetach-controller under deploy/'s RBAC: %v", refused)
		}
	}()
	ad := w.waitLease("kube-system", latchADLease, "held by attachdetach-controller", held)
	w.leaderElectionEvent("kube-system", latchADLease, ad.holder, "attachdetach-controller")

	// 3. Check: kcm's attachments kept; a detach and new attaches work.
	gone := l.remove(1)
	l.add(2)
	l.settled(gone, true)
	w.nodesStayReady()
	l.drain()
	after := w.waitLease("kube-system", kcmLease, "handed over to kube-controller-manager without attachdetach", handedOver(kcm))
	t.Logf("kcm Lease %s → %s; swap done %s after the start", kcm, after, time.Since(start).Round(time.Second))

	samples, err := w.ctrl.Scrape(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := samples.Value("rest_client_requests_total", map[string]string{"code": "201"}); !ok || v == 0 {
		t.Errorf("attachdetach-controller created nothing (rest_client_requests_total{code=\"201\"} = %v): the check above saw no work", v)
	}
}
