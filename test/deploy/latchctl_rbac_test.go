package deploy_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/latchcsi/latch/internal/kube/kubenames"
	"github.com/latchcsi/latch/internal/localcluster"
)

// viewerKubeconfig creates a ServiceAccount bound to clusterRole and
// writes a kubeconfig that authenticates with its token.
func viewerKubeconfig(ctx context.Context, t *testing.T, name string, role *rbacv1.ClusterRole) string {
	t.Helper()
	client := cluster.Client()
	if _, err := client.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	sa := &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}}
	if _, err := client.CoreV1().ServiceAccounts("default").Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "default", Name: name}},
	}
	if _, err := client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	// Removed after the test, the deploy/latchctl ClusterRole too: the
	// package's server-side dry-run of deploy/latchctl, and this test run
	// again, would find them.
	t.Cleanup(func() {
		ctx := context.Background()
		_ = client.RbacV1().ClusterRoleBindings().Delete(ctx, name, metav1.DeleteOptions{})
		_ = client.CoreV1().ServiceAccounts("default").Delete(ctx, name, metav1.DeleteOptions{})
		_ = client.RbacV1().ClusterRoles().Delete(ctx, role.Name, metav1.DeleteOptions{})
	})
	rc, err := cluster.ServiceAccountConfig(ctx, "default", name)
	if err != nil {
		t.Fatal(err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["local"] = &clientcmdapi.Cluster{Server: rc.Host, CertificateAuthorityData: rc.CAData}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: rc.BearerToken}
	cfg.Contexts[name] = &clientcmdapi.Context{Cluster: "local", AuthInfo: name, Namespace: "default"}
	cfg.CurrentContext = name
	path := filepath.Join(t.TempDir(), name+".kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// The read-only ClusterRole in deploy/latchctl is enough for every read
// latchctl makes: explain and status run as a ServiceAccount bound only to
// it and report nothing as forbidden. Without the Lease rule, the report
// says the Leases are forbidden (so the check can fail).
func TestLatchctlNeedsNothingBeyondItsReadOnlyRole(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	objs := kustomize(t, "deploy/latchctl")
	if len(objs) != 1 || objs[0].GetKind() != "ClusterRole" {
		t.Fatalf("deploy/latchctl renders %d objects, want the ClusterRole", len(objs))
	}
	role := &rbacv1.ClusterRole{}
	if err := k8sruntime.DefaultUnstructuredConverter.FromUnstructured(objs[0].Object, role); err != nil {
		t.Fatal(err)
	}
	for _, r := range role.Rules {
		for _, res := range r.Resources {
			if res == "secrets" {
				t.Error("the latchctl role grants Secrets")
			}
		}
		for _, v := range r.Verbs {
			if v != "get" && v != "list" {
				t.Errorf("the latchctl role grants %q; it must be read-only", v)
			}
		}
	}
	noLeases := role.DeepCopy()
	noLeases.Name = "latch-latchctl-without-leases"
	noLeases.Rules = noLeases.Rules[:len(noLeases.Rules)-1]

	// A Pod whose attachment fails.
	client := cluster.Client()
	const driver = "rbac.csi.latch.dev"
	pv, _, err := localcluster.CreateBoundVolume(ctx, client, localcluster.VolumeSpec{Namespace: "default", Name: "rbac-data", Driver: driver})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		zero := int64(0)
		_ = client.CoreV1().Pods("default").Delete(ctx, "rbac-app", metav1.DeleteOptions{GracePeriodSeconds: &zero})
		_ = client.StorageV1().VolumeAttachments().Delete(ctx, kubenames.VolumeAttachmentName(pv.Spec.CSI.VolumeHandle, driver, "rbac-node"), metav1.DeleteOptions{})
		// No controller here removes the protection finalizers the API
		// server's admission adds.
		noFinalizers := []byte(`{"metadata":{"finalizers":null}}`)
		_ = client.CoreV1().PersistentVolumeClaims("default").Delete(ctx, "rbac-data", metav1.DeleteOptions{})
		_, _ = client.CoreV1().PersistentVolumeClaims("default").Patch(ctx, "rbac-data", types.MergePatchType, noFinalizers, metav1.PatchOptions{})
		_ = client.CoreV1().PersistentVolumes().Delete(ctx, pv.Name, metav1.DeleteOptions{})
		_, _ = client.CoreV1().PersistentVolumes().Patch(ctx, pv.Name, types.MergePatchType, noFinalizers, metav1.PatchOptions{})
	})
	if _, err := client.CoreV1().Pods("default").Create(ctx, localcluster.NewPod("default", "rbac-app", "rbac-node", pv.Name), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	va := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: kubenames.VolumeAttachmentName(pv.Spec.CSI.VolumeHandle, driver, "rbac-node")},
		Spec:       storagev1.VolumeAttachmentSpec{Attacher: driver, NodeName: "rbac-node", Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv.Name}},
	}
	va, err = client.StorageV1().VolumeAttachments().Create(ctx, va, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	va.Status.AttachError = &storagev1.VolumeError{Time: metav1.Now(), Message: "rpc error: code = NotFound desc = no such volume"}
	if _, err := client.StorageV1().VolumeAttachments().UpdateStatus(ctx, va, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	latchctl := filepath.Join(binaries(t), "latchctl")
	run := func(kubeconfig string, args ...string) (string, int) {
		cmd := exec.CommandContext(ctx, latchctl, append([]string{"--kubeconfig", kubeconfig}, args...)...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		return string(out) + stderr.String(), exitCode(err)
	}

	full := viewerKubeconfig(ctx, t, "latchctl-viewer", role)
	for _, args := range [][]string{{"explain", "pod", "default/rbac-app"}, {"explain", "pv", pv.Name}, {"status", "--driver", driver}} {
		out, code := run(full, args...)
		if code != 1 {
			t.Errorf("latchctl %v exited %d, want 1 (the attach error is a problem):\n%s", args, code, out)
		}
		if strings.Contains(strings.ToLower(out), "forbidden") {
			t.Errorf("latchctl %v as the latch-latchctl role hit a forbidden read:\n%s", args, out)
		}
		if !strings.Contains(out, "no such volume") {
			t.Errorf("latchctl %v does not report the attach error:\n%s", args, out)
		}
	}

	limited := viewerKubeconfig(ctx, t, "latchctl-no-leases", noLeases)
	out, _ := run(limited, "explain", "pod", "default/rbac-app")
	t.Logf("without the Lease rule:\n%s", out)
	if !strings.Contains(strings.ToLower(out), "forbidden") {
		t.Errorf("without the Lease rule, explain does not report a forbidden read:\n%s", out)
	}
}
