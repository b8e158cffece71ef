package attacher_test

import (
	"bytes"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/latchcsi/latch/internal/localcluster"
	"github.com/latchcsi/latch/internal/testsupport"
)

// applyRBAC creates the ServiceAccount, roles and bindings of
// deploy/csi-attacher/rbac.yaml and of the read-secrets overlay (the test
// below uses a controller-publish secret; the base grants no Secrets).
func applyRBAC(t *testing.T, e *env) {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	deployDir := filepath.Join(filepath.Dir(file), "..", "..", "..", "deploy")
	var data []byte
	for _, f := range []string{"csi-attacher/rbac.yaml", "overlays/csi-attacher-read-secrets/read-secrets.yaml"} {
		d, err := os.ReadFile(filepath.Join(deployDir, f))
		if err != nil {
			t.Fatal(err)
		}
		data = append(append(data, d...), "\n---\n"...)
	}
	if err := localcluster.CreateNamespace(e.ctx, e.client, "latch-system"); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var u unstructured.Unstructured
		if err := dec.Decode(&u.Object); err != nil {
			break
		}
		if len(u.Object) == 0 {
			continue
		}
		raw, _ := yaml.Marshal(u.Object)
		var createErr error
		switch u.GetKind() {
		case "ServiceAccount":
			var o v1.ServiceAccount
			_ = yaml.Unmarshal(raw, &o)
			_, createErr = e.client.CoreV1().ServiceAccounts(o.Namespace).Create(e.ctx, &o, metav1.CreateOptions{})
		case "ClusterRole":
			var o rbacv1.ClusterRole
			_ = yaml.Unmarshal(raw, &o)
			_, createErr = e.client.RbacV1().ClusterRoles().Create(e.ctx, &o, metav1.CreateOptions{})
		case "ClusterRoleBinding":
			var o rbacv1.ClusterRoleBinding
			_ = yaml.Unmarshal(raw, &o)
			_, createErr = e.client.RbacV1().ClusterRoleBindings().Create(e.ctx, &o, metav1.CreateOptions{})
		case "Role":
			var o rbacv1.Role
			_ = yaml.Unmarshal(raw, &o)
			_, createErr = e.client.RbacV1().Roles(o.Namespace).Create(e.ctx, &o, metav1.CreateOptions{})
		case "RoleBinding":
			var o rbacv1.RoleBinding
			_ = yaml.Unmarshal(raw, &o)
			_, createErr = e.client.RbacV1().RoleBindings(o.Namespace).Create(e.ctx, &o, metav1.CreateOptions{})
		default:
			t.Fatalf("unexpected kind %s in rbac.yaml", u.GetKind())
		}
		if createErr != nil && !apierrors.IsAlreadyExists(createErr) {
			t.Fatalf("create %s %s: %v", u.GetKind(), u.GetName(), createErr)
		}
	}
}

// The attacher runs with a ServiceAccount token bound only to deploy/'s
// RBAC, with leader election and a controller-publish secret: the whole
// attach/detach path works and no request is forbidden.
func TestAttacherNeedsNothingBeyondDeployRBAC(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.stopAtt() // replaced by one running as the ServiceAccount
	applyRBAC(t, e)
	tok, err := e.client.CoreV1().ServiceAccounts("latch-system").CreateToken(e.ctx, "csi-attacher",
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var forbidden atomic.Int64
	cfg := cluster.AnonymousConfig()
	cfg.BearerToken = tok.Status.Token
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return testsupport.RoundTripFunc(func(r *http.Request) (*http.Response, error) {
			resp, err := rt.RoundTrip(r)
			if err == nil && (resp.StatusCode == http.StatusForbidden || resp.StatusCode == http.StatusUnauthorized) {
				forbidden.Add(1)
				t.Logf("forbidden: %s %s", r.Method, r.URL.Path)
			}
			return resp, err
		})
	}
	stop := e.startAttacherAs(cfg, envOptions{leader: true}, "rbac", "latch-system")
	defer stop()

	pv, vaName, secret := e.prefix+"-pv", e.prefix+"-va", e.prefix+"-secret"
	s := &v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: secret}, StringData: map[string]string{"key": "value"}}
	if _, err := e.client.CoreV1().Secrets("default").Create(e.ctx, s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.createPV(pv, func(s *localcluster.VolumeSpec) {
		s.SecretRef = &v1.SecretReference{Namespace: "default", Name: secret}
	})
	e.createVA(e.newVA(vaName, pv, e.node))
	e.waitAttached(vaName, 30*time.Second)
	e.deleteVA(vaName)
	e.waitGone(vaName)
	if err := e.client.CoreV1().PersistentVolumes().Delete(e.ctx, pv, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.eventually(30*time.Second, "PV finalizer removed", func() (bool, error) {
		p, err := e.client.CoreV1().PersistentVolumes().Get(e.ctx, pv, metav1.GetOptions{})
		return err == nil && len(p.Finalizers) == 1, nil // only kubernetes.io/pv-protection left
	})
	if n := forbidden.Load(); n != 0 {
		t.Fatalf("%d requests were forbidden for the deploy/ RBAC", n)
	}
}
