package attacher_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// secretlessAttacher creates a ServiceAccount with deploy/'s csi-attacher
// rights minus any rule on secrets (whatever deploy/ grants today) and
// returns a client config for it.
func secretlessAttacher(t *testing.T, e *env) (*kubernetes.Clientset, string) {
	t.Helper()
	applyRBAC(t, e)
	ctx, ns, sa := e.ctx, "latch-system", e.prefix+"-sa"
	cleanup := func(f func(context.Context) error) {
		t.Cleanup(func() { _ = f(context.Background()) })
	}
	if _, err := e.client.CoreV1().ServiceAccounts(ns).Create(ctx, &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cleanup(func(ctx context.Context) error {
		return e.client.CoreV1().ServiceAccounts(ns).Delete(ctx, sa, metav1.DeleteOptions{})
	})
	subject := []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: ns}}
	deployed, err := e.client.RbacV1().ClusterRoles().Get(ctx, "latch-csi-attacher", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: e.prefix + "-no-secrets"}}
	for _, r := range deployed.Rules {
		if !slices.Contains(r.Resources, "secrets") && !slices.Contains(r.Resources, "*") {
			role.Rules = append(role.Rules, r)
		}
	}
	if _, err := e.client.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cleanup(func(ctx context.Context) error {
		return e.client.RbacV1().ClusterRoles().Delete(ctx, role.Name, metav1.DeleteOptions{})
	})
	crb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role.Name}, Subjects: subject,
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name}}
	if _, err := e.client.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cleanup(func(ctx context.Context) error {
		return e.client.RbacV1().ClusterRoleBindings().Delete(ctx, crb.Name, metav1.DeleteOptions{})
	})
	// deploy/'s namespaced rights (the Lease, the orphans ConfigMap).
	roles, err := e.client.RbacV1().Roles(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range roles.Items {
		if !strings.HasPrefix(r.Name, "latch-csi-attacher") {
			continue
		}
		rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: e.prefix + "-" + r.Name}, Subjects: subject,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: r.Name}}
		if _, err := e.client.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		cleanup(func(ctx context.Context) error {
			return e.client.RbacV1().RoleBindings(ns).Delete(ctx, rb.Name, metav1.DeleteOptions{})
		})
	}
	cfg, err := cluster.ServiceAccountConfig(ctx, ns, sa)
	if err != nil {
		t.Fatal(err)
	}
	e.stopAtt = e.startAttacherAs(cfg, envOptions{}, "secretless", ns)
	return kubernetes.NewForConfigOrDie(cfg), sa
}

// With no right to read Secrets (deploy/'s default), a volume whose PV
// names a controller-publish secret is not attached and not detached
// without it: attachError and detachError name the secret and the RBAC
// rule to add, the driver is not called, and granting the rule lets the
// retry (every SecretRetryInterval, as for a missing secret) go through.
func TestAttacherWithoutSecretAccess_errorsNameSecretAndRBACRuleAndRetryAfterGrant(t *testing.T) {
	e := newEnv(t, envOptions{noAttacher: true})
	saClient, sa := secretlessAttacher(t, e)
	pv, vaName, secret := e.prefix+"-pv", e.prefix+"-va", e.prefix+"-secret"
	e.createPVWithSecret(pv, secret, map[string]string{"key": "value"})
	readable := func(want bool) {
		t.Helper()
		e.eventually(10*time.Second, "the ServiceAccount's access to the Secret to settle", func() (bool, error) {
			_, err := saClient.CoreV1().Secrets("default").Get(e.ctx, secret, metav1.GetOptions{})
			return (err == nil) == want && (want || apierrors.IsForbidden(err)), nil
		})
	}
	readable(false)
	wantInMessage := func(what, msg string) {
		t.Helper()
		for _, want := range []string{"default/" + secret, "not allowed to read", "verbs [get] on resource secrets", `namespace "default"`, sa} {
			if !strings.Contains(msg, want) {
				t.Errorf("%s %q does not contain %q", what, msg, want)
			}
		}
	}
	publishes := func() int { return len(e.callsFor("ControllerPublishVolume", pv)) }
	unpublishes := func() int { return len(e.callsFor("ControllerUnpublishVolume", pv)) }

	e.createVA(e.newVA(vaName, pv, e.node))
	va := e.waitAttachError(vaName, "not allowed to read")
	wantInMessage("attachError", va.Status.AttachError.Message)
	t.Logf("attachError: %s", va.Status.AttachError.Message)
	time.Sleep(1500 * time.Millisecond) // three SecretRetryIntervals
	if va := e.getVA(vaName); va.Status.Attached || publishes() != 0 {
		t.Fatalf("without the secret: attached=%v, %d ControllerPublishVolume calls; want neither", va.Status.Attached, publishes())
	}

	grant := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: e.prefix + "-read-secret"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}, ResourceNames: []string{secret}}}}
	if _, err := e.client.RbacV1().Roles("default").Create(e.ctx, grant, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: grant.Name},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: "latch-system"}},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: grant.Name}}
	bind := func() {
		t.Helper()
		if _, err := e.client.RbacV1().RoleBindings("default").Create(e.ctx, rb, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	unbind := func() {
		t.Helper()
		if err := e.client.RbacV1().RoleBindings("default").Delete(e.ctx, rb.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_ = e.client.RbacV1().RoleBindings("default").Delete(context.Background(), rb.Name, metav1.DeleteOptions{})
		_ = e.client.RbacV1().Roles("default").Delete(context.Background(), grant.Name, metav1.DeleteOptions{})
	})
	bind()
	va = e.waitAttached(vaName, 10*time.Second)
	if va.Status.AttachError != nil || publishes() != 1 {
		t.Fatalf("after the grant: attachError %v, %d ControllerPublishVolume calls; want none and 1", va.Status.AttachError, publishes())
	}

	unbind()
	readable(false)
	e.deleteVA(vaName)
	e.eventually(30*time.Second, "detachError naming the secret", func() (bool, error) {
		va = e.getVA(vaName)
		return va != nil && va.Status.DetachError != nil && strings.Contains(va.Status.DetachError.Message, "not allowed to read"), nil
	})
	wantInMessage("detachError", va.Status.DetachError.Message)
	time.Sleep(1500 * time.Millisecond) // three SecretRetryIntervals
	if va := e.getVA(vaName); unpublishes() != 0 || len(va.Finalizers) == 0 {
		t.Fatalf("without the secret: %d ControllerUnpublishVolume calls, finalizers %v; want none and ours kept", unpublishes(), va.Finalizers)
	}
	bind()
	e.waitGone(vaName)
	if unpublishes() != 1 {
		t.Fatalf("after the grant: %d ControllerUnpublishVolume calls; want 1", unpublishes())
	}
}
