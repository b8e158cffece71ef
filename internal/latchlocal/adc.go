package latchlocal

import (
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/attachdetach/controller"
)

// controllerConfig is the attach/detach controller's configuration in
// latch-local: the binary's defaults with 10 workers (a demo cluster has a
// handful of volumes) and its metrics in no registry (latch-local serves
// none).
func controllerConfig(c *controller.ServeConfig) {
	c.Controller.Workers = 10
	c.Registry = nil
}

func metavCreate() metav1.CreateOptions { return metav1.CreateOptions{} }

func isAlreadyExists(err error) bool { return apierrors.IsAlreadyExists(err) }
