package latchlocal

import (
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/attachdetach/controller"
)

// controllerConfig is the attach/detach controller's configuration in
// latch-local: the binary's defaults with 10 workers (a demo cluster has a
// handful of volumes), and with leader election on its Lease in
// kube-system as the manifests run it (the stack turns it off for tests),
// so that leader_election_master_status reports the Lease holder as in a
// cluster. Its metrics: serveControllerMetrics.
func controllerConfig(c *controller.ServeConfig) {
	c.Controller.Workers = 10
	c.Leader = controller.DefaultServeConfig().Leader
}

func metavCreate() metav1.CreateOptions { return metav1.CreateOptions{} }

func isAlreadyExists(err error) bool { return apierrors.IsAlreadyExists(err) }
