package attachdetach_test

import (
	"context"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-base/metrics"

	"github.com/latchcsi/latch/internal/app"
	"github.com/latchcsi/latch/internal/attachdetach/controller"
	"github.com/latchcsi/latch/internal/kube/kubetest"
)

// TestServe_leaderElectionAttachAndCleanShutdown runs what the binary runs
// (controller.Serve) and checks that it takes the Lease, attaches, and on
// cancellation stops and releases the Lease.
func TestServe_leaderElectionAttachAndCleanShutdown(t *testing.T) {
	e := newEnvWithoutController(t, controller.Config{Workers: 4})
	lease := e.prefix + "-leader"
	ctx, cancel := context.WithCancel(e.ctx)
	done := make(chan error, 1)
	wire := kubetest.NewWireFormats()
	cfg := cluster.RESTConfig()
	cfg.WrapTransport = wire.Wrap
	go func() {
		done <- controller.Serve(ctx, controller.ServeConfig{
			RESTConfig: cfg,
			Registry:   metrics.NewKubeRegistry(),
			Controller: controller.Config{Workers: 4},
			Leader: app.LeaderElection{
				Enabled: true, LeaseName: lease, Namespace: e.ns, Identity: "replica-1",
				LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second,
			},
		})
	}()
	t.Cleanup(func() { cancel() })

	node := e.addNode("n1")
	pv := e.volume("served", rwo())
	e.pod("app", node, pv)
	e.waitAttachedVA(pv, node)
	e.waitNodeAttached(node, e.unique(pv))
	e.waitPodRunning("app")
	if l := e.lease(lease); l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != "replica-1" {
		t.Errorf("Lease holder = %v, want replica-1", l.Spec.HolderIdentity)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve returned %v after cancellation, want nil", err)
		}
	case <-time.After(timeout):
		t.Fatal("Serve did not return after cancellation")
	}
	if l := e.lease(lease); l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" {
		t.Errorf("Lease still held by %q after shutdown", *l.Spec.HolderIdentity)
	}
	// It speaks protobuf, as kube-controller-manager does by default.
	for _, res := range []string{"pods", "nodes", "volumeattachments", "persistentvolumes", "leases"} {
		if got := wire.Of(res); len(got) != 1 || got["application/vnd.kubernetes.protobuf"] == 0 {
			t.Errorf("%s answered as %v, want only protobuf", res, got)
		}
	}
}

func (e *env) lease(name string) *coordinationv1.Lease {
	e.t.Helper()
	l, err := e.client.CoordinationV1().Leases(e.ns).Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatalf("get Lease %s: %v", name, err)
	}
	return l
}
