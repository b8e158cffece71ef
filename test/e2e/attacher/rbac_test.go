package attacher_test

import (
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/localcluster"
	"github.com/latchcsi/latch/internal/testsupport"
)

// applyRBAC creates the ServiceAccount, roles and bindings of
// deploy/csi-attacher/rbac.yaml and of the read-secrets overlay (the test
// below uses a controller-publish secret; the base grants no Secrets).
func applyRBAC(t *testing.T, e *env) {
	t.Helper()
	var manifests [][]byte
	for _, f := range []string{"deploy/csi-attacher/rbac.yaml", "deploy/overlays/csi-attacher-read-secrets/read-secrets.yaml"} {
		d, err := testsupport.RepoFile(f)
		if err != nil {
			t.Fatal(err)
		}
		manifests = append(manifests, d)
	}
	if err := localcluster.CreateNamespace(e.ctx, e.client, "latch-system"); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := testsupport.ApplyRBAC(e.ctx, e.client, manifests...); err != nil {
		t.Fatal(err)
	}
}

// The attacher runs with a ServiceAccount token bound only to deploy/'s
// RBAC, with leader election and a controller-publish secret: the whole
// attach/detach path works and no request is forbidden.
func TestAttacherNeedsNothingBeyondDeployRBAC(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.stopAtt() // replaced by one running as the ServiceAccount
	applyRBAC(t, e)
	cfg, err := cluster.ServiceAccountConfig(e.ctx, "latch-system", "csi-attacher")
	if err != nil {
		t.Fatal(err)
	}
	api := testsupport.NewAPITransport()
	cfg.WrapTransport = api.Wrap
	stop := e.startAttacherAs(cfg, envOptions{leader: true}, "rbac", "latch-system")
	defer stop()

	pv, vaName, secret := e.prefix+"-pv", e.prefix+"-va", e.prefix+"-secret"
	e.createPVWithSecret(pv, secret, map[string]string{"key": "value"})
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
	if denied := api.Denied(); len(denied) != 0 {
		t.Fatalf("%d requests were refused for the deploy/ RBAC:\n%s", len(denied), strings.Join(denied, "\n"))
	}
}
