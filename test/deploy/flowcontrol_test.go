package deploy_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
)

// The Lease requests of latch's two leaders are classified by API Priority
// and Fairness the way their upstream counterparts' are, with the API
// server's suggested FlowSchemas and nothing latch installs: the
// attach/detach controller's ServiceAccount lives in kube-system, so its
// Lease reads and renewals fall under system-leader-election (priority
// level leader-election), as kube-controller-manager's do, and a loaded API
// server does not queue them behind workloads; csi-attacher's, in the
// driver's namespace, fall under service-accounts (workload-low), as the
// upstream external-attacher's do. Both FlowSchemas match a ServiceAccount
// by its namespace only, so the requests carry the token of a
// ServiceAccount of their own in the namespace of the manifests' one (the
// manifests' own names stay free for the server-side dry-runs of this
// package, which create them).
func TestLeaderLeaseRequestsAreClassifiedAsUpstreamsAre(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	for _, tc := range []struct {
		dir, flowSchema, priorityLevel string
	}{
		{"deploy/attachdetach-controller", "system-leader-election", "leader-election"},
		{"deploy/csi-attacher", "service-accounts", "workload-low"},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			sa := probeServiceAccountBeside(t, tc.dir, kustomize(t, tc.dir))
			got, err := leaseRequestFlowSchema(ctx, sa.Namespace, sa.Name)
			if err != nil {
				t.Fatal(err)
			}
			fs, err := cluster.Client().FlowcontrolV1().FlowSchemas().Get(ctx, tc.flowSchema, metav1.GetOptions{})
			if err != nil {
				t.Fatalf("FlowSchema %s: %v", tc.flowSchema, err)
			}
			if got != string(fs.UID) {
				t.Errorf("a Lease GET by ServiceAccount %s/%s is classified by FlowSchema UID %q, want %s's (%s)", sa.Namespace, sa.Name, got, tc.flowSchema, fs.UID)
			}
			if fs.Spec.PriorityLevelConfiguration.Name != tc.priorityLevel {
				t.Errorf("FlowSchema %s sends its requests to priority level %s, want %s", tc.flowSchema, fs.Spec.PriorityLevelConfiguration.Name, tc.priorityLevel)
			}
		})
	}
}

// probeServiceAccountBeside creates, for the test's life, a ServiceAccount
// in the namespace of the one ServiceAccount objs (the rendering of dir)
// define, named after it with a "-flow-probe" suffix, and returns it.
func probeServiceAccountBeside(t *testing.T, dir string, objs []*unstructured.Unstructured) *v1.ServiceAccount {
	t.Helper()
	var sa *v1.ServiceAccount
	for _, o := range objs {
		if o.GetKind() == "ServiceAccount" {
			if sa != nil {
				t.Fatalf("%s defines more than one ServiceAccount", dir)
			}
			sa = &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: o.GetNamespace(), Name: o.GetName() + "-flow-probe"}}
		}
	}
	if sa == nil {
		t.Fatalf("%s defines no ServiceAccount", dir)
	}
	client := cluster.Client()
	ns := &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: sa.Namespace}}
	if _, err := client.CoreV1().Namespaces().Create(t.Context(), ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().ServiceAccounts(sa.Namespace).Create(t.Context(), sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		err := client.CoreV1().ServiceAccounts(sa.Namespace).Delete(context.Background(), sa.Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete ServiceAccount %s/%s: %v", sa.Namespace, sa.Name, err)
		}
	})
	return sa
}

// leaseRequestFlowSchema sends a GET of a Lease in namespace as the
// ServiceAccount namespace/name and returns the UID of the FlowSchema API
// Priority and Fairness classified it by (the X-Kubernetes-PF-FlowSchema-UID
// answer header; the Lease need not exist, nor the GET be allowed). It
// retries while the header is missing: the API server's flow control
// takes its configuration from the FlowSchema objects it creates at start.
func leaseRequestFlowSchema(ctx context.Context, namespace, name string) (string, error) {
	cfg, err := cluster.ServiceAccountConfig(ctx, namespace, name)
	if err != nil {
		return "", err
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return "", err
	}
	url := fmt.Sprintf("%s/apis/coordination.k8s.io/v1/namespaces/%s/leases/%s", cfg.Host, namespace, name)
	var uid string
	err = wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false, err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		uid = resp.Header.Get("X-Kubernetes-PF-FlowSchema-UID")
		return uid != "", nil
	})
	if err != nil {
		return "", fmt.Errorf("GET %s as %s/%s: no X-Kubernetes-PF-FlowSchema-UID header in the answers: %w", url, namespace, name, err)
	}
	return uid, nil
}
