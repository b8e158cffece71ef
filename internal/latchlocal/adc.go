package latchlocal

import (
	"context"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/attachdetach/controller"
)

// startAttachDetach runs the attach/detach controller through the same
// entry point as its binary.
func (e *Env) startAttachDetach(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithName("attachdetach-controller")
	e.goRun(func() error {
		return controller.Serve(klog.NewContext(ctx, logger), controller.ServeConfig{
			RESTConfig: e.Cluster.RESTConfig(),
			Controller: controller.Config{
				Workers:           10,
				MaxWaitForUnmount: 6 * time.Minute,
				VerifyPeriod:      time.Minute,
			},
		})
	})
	return nil
}

func metavCreate() metav1.CreateOptions { return metav1.CreateOptions{} }

func isAlreadyExists(err error) bool { return apierrors.IsAlreadyExists(err) }
