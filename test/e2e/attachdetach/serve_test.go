package attachdetach_test

import (
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
	wire := kubetest.NewWireFormats()
	c := e.stack.StartController(e.ctx, func(c *controller.ServeConfig) {
		c.RESTConfig = cluster.RESTConfig()
		c.RESTConfig.WrapTransport = wire.Wrap
		c.Controller = controller.Config{Workers: 4}
		c.Leader = app.LeaderElection{
			Enabled: true, LeaseName: lease, Namespace: e.ns, Identity: "replica-1",
			LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second,
		}
	})
	c.StopTimeout = timeout

	node, pv, _ := e.runningPod("served")
	e.waitNodeAttached(node, e.unique(pv))
	if l := e.lease(lease); l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != "replica-1" {
		t.Errorf("Lease holder = %v, want replica-1", l.Spec.HolderIdentity)
	}

	_ = c.Stop() // cancels, waits up to timeout; Result is what Serve returned
	select {
	case <-c.Exited():
	default:
		t.Fatal("Serve did not return after cancellation")
	}
	if err := c.Result(); err != nil {
		t.Fatalf("Serve returned %v after cancellation, want nil", err)
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
