package attachdetach_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	authorizationv1 "k8s.io/api/authorization/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/app"
	"github.com/latchcsi/latch/internal/attachdetach/controller"
	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/testsupport"
)

// applyDeployRBAC creates what deploy/attachdetach-controller/rbac.yaml
// declares and returns the ServiceAccount's namespace and name.
func applyDeployRBAC(t *testing.T, e *env) (string, string) {
	t.Helper()
	data, err := testsupport.RepoFile("deploy/attachdetach-controller/rbac.yaml")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := testsupport.ApplyRBAC(e.ctx, e.client, data)
	if err != nil {
		t.Fatalf("rbac.yaml: %v", err)
	}
	var saNS, saName string
	roles := map[string][]rbacv1.PolicyRule{} // "namespace/name" or "/name"
	var bindings []struct{ ns, role string }
	for _, obj := range objs {
		switch o := obj.(type) {
		case *v1.ServiceAccount:
			saNS, saName = o.Namespace, o.Name
		case *rbacv1.ClusterRole:
			roles["/"+o.Name] = o.Rules
		case *rbacv1.ClusterRoleBinding:
			bindings = append(bindings, struct{ ns, role string }{"", "/" + o.RoleRef.Name})
		case *rbacv1.Role:
			roles[o.Namespace+"/"+o.Name] = o.Rules
		case *rbacv1.RoleBinding:
			role := "/" + o.RoleRef.Name
			if o.RoleRef.Kind == "Role" {
				role = o.Namespace + role
			}
			bindings = append(bindings, struct{ ns, role string }{o.Namespace, role})
		}
	}
	if saName == "" {
		t.Fatal("rbac.yaml declares no ServiceAccount")
	}
	var grants []grant
	for _, b := range bindings {
		grants = append(grants, grantsOf(b.ns, roles[b.role])...)
	}
	if len(grants) == 0 {
		t.Fatal("rbac.yaml binds no rules")
	}
	waitAuthorized(t, e, "system:serviceaccount:"+saNS+":"+saName, grants)
	return saNS, saName
}

// grant is one verb on one resource that rbac.yaml gives, in namespace ns
// ("" for cluster-wide).
type grant struct {
	ns, group, resource, verb string
}

func grantsOf(ns string, rules []rbacv1.PolicyRule) []grant {
	var out []grant
	for _, r := range rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					out = append(out, grant{ns: ns, group: g, resource: res, verb: v})
				}
			}
		}
	}
	return out
}

// waitAuthorized waits until the API server's authorizer has caught up
// with the new roles and bindings: a request made before that is refused
// although the RBAC is right.
func waitAuthorized(t *testing.T, e *env, user string, grants []grant) {
	t.Helper()
	for _, g := range grants {
		resource, sub, _ := strings.Cut(g.resource, "/")
		e.eventually(fmt.Sprintf("%s allowed to %s %s", user, g.verb, g.resource), func() (bool, error) {
			sar, err := e.client.AuthorizationV1().SubjectAccessReviews().Create(e.ctx, &authorizationv1.SubjectAccessReview{
				Spec: authorizationv1.SubjectAccessReviewSpec{User: user, Groups: []string{"system:serviceaccounts", "system:authenticated"},
					ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: g.ns, Group: g.group, Resource: resource, Subresource: sub, Verb: g.verb}},
			}, metav1.CreateOptions{})
			return err == nil && sar.Status.Allowed, err
		})
	}
}

// The controller runs as it is deployed: Serve, leader election on a
// Lease in kube-system, a ServiceAccount token bound only to deploy/'s
// RBAC. A Pod's volume goes through a failing attach (repeated Warning
// events, so the recorder both creates and patches events), a multi-attach
// conflict, attach, node status, detach; no request is refused.
func TestDeployRBAC_controllerNeedsNothingMore(t *testing.T) {
	e := newEnvWith(t, envOptions{mockDriver: true, noController: true})
	drv := e.stack.Driver
	saNS, saName := applyDeployRBAC(t, e)
	cfg, err := cluster.ServiceAccountConfig(e.ctx, saNS, saName)
	if err != nil {
		t.Fatal(err)
	}
	api := testsupport.NewAPITransport()
	cfg.WrapTransport = api.Wrap

	c := e.stack.StartController(e.ctx, func(c *controller.ServeConfig) {
		c.RESTConfig = cfg
		c.Controller = controller.Config{Workers: 4, VerifyPeriod: time.Second}
		c.Leader = app.LeaderElection{
			Enabled: true, LeaseName: e.prefix + "-rbac", Namespace: saNS, Identity: "rbac",
			LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second,
		}
	})
	c.StopTimeout = timeout
	stop := func() {
		if err := c.Stop(); err != nil {
			t.Errorf("Serve: %v", err)
		}
	}
	t.Cleanup(stop)

	n1, n2 := e.addNode("n1"), e.addNode("n2")
	pv := e.volume("rbac", rwo())
	// The driver fails with one message, then another, then the first
	// again: the third Warning repeats the first, which the event recorder
	// sends as a patch of the first event's count.
	fault := ""
	failWith := func(msg string) {
		t.Helper()
		id, err := drv.AddFault(csimock.Rule{Method: "ControllerPublishVolume", VolumeID: pv, Code: codes.NotFound, Message: msg})
		if err != nil {
			t.Fatal(err)
		}
		if fault != "" {
			drv.RemoveFault(fault)
		}
		fault = id
	}
	warned := func(msg string, count int32) {
		t.Helper()
		e.eventually(fmt.Sprintf("FailedAttachVolume %q with count %d", msg, count), func() (bool, error) {
			for _, ev := range e.events("first", "FailedAttachVolume") {
				if strings.HasSuffix(ev.Message, msg) && ev.Count >= count {
					return true, nil
				}
			}
			return false, nil
		})
	}
	failWith("no such disk yet")
	e.pod("first", n1, pv)
	warned("no such disk yet", 1)
	failWith("disk is being resized")
	warned("disk is being resized", 1)
	// An attachError's time has second resolution, and the same text at the
	// same time is the same condition (one event): let a second pass.
	time.Sleep(1100 * time.Millisecond)
	failWith("no such disk yet")
	warned("no such disk yet", 2)
	drv.RemoveFault(fault)
	e.waitAttachedVA(pv, n1)
	e.waitNodeAttached(n1, e.unique(pv))
	e.waitPodRunning("first")

	e.pod("second", n2, pv)
	e.waitEvent("second", "FailedAttachVolume", fmt.Sprintf("Multi-Attach error for volume %q Volume is already used by pod(s) first", pv))
	e.deletePod("first")
	e.waitVAGone(pv, n1)
	e.waitNodeAttached(n1)
	e.waitAttachedVA(pv, n2)
	e.waitNodeAttached(n2, e.unique(pv))
	e.waitPodRunning("second")
	e.deletePod("second")
	e.waitVAGone(pv, n2)
	e.waitNodeAttached(n2)

	stop() // releases the Lease: an update
	l, err := e.client.CoordinationV1().Leases(saNS).Get(e.ctx, e.prefix+"-rbac", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get Lease: %v", err)
	}
	if h := l.Spec.HolderIdentity; h != nil && *h != "" {
		t.Errorf("Lease still held by %q after shutdown", *h)
	}
	if got := api.Denied(); len(got) != 0 {
		t.Fatalf("%d requests refused for deploy/attachdetach-controller/rbac.yaml:\n%s", len(got), strings.Join(got, "\n"))
	}
}
