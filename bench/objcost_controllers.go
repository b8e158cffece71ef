package bench

import (
	"context"
	"errors"
	"sync/atomic"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/latchcsi/latch/internal/attachdetach/controller"
	"github.com/latchcsi/latch/internal/attacher"
	"github.com/latchcsi/latch/internal/csi"
)

// objControllers are the two controllers, built as their binaries build
// them (internal/attacher/sidecar.go, internal/attachdetach/controller/serve.go)
// but on the benchmark's clientset, with events dropped and no metrics
// endpoint.
func objControllers() []objController {
	return []objController{
		{name: "csi-attacher", start: startObjAttacher},
		{name: "attachdetach-controller", start: startObjController},
	}
}

func startObjAttacher(_ context.Context, client kubernetes.Interface, driver string) (*objRun, error) {
	factory := attacher.NewInformers(client, 0, driver)
	cfg := attacher.DefaultConfig()
	cfg.Driver = attacher.DriverInfo{Name: driver}
	cfg.ReconcileSync = 0 // ListVolumes is not what is measured
	calls := &countingCSI{}
	ctrl, err := attacher.New(cfg, client, factory, calls, &record.FakeRecorder{}, nil)
	if err != nil {
		return nil, err
	}
	infs := factory.ByKind()
	return &objRun{
		informers: infs,
		run: func(ctx context.Context) error {
			factory.Start(ctx.Done())
			return ctrl.Run(ctx)
		},
		idle: func() bool {
			for _, q := range ctrl.Backlogs() {
				if q.Len() > 0 {
					return false
				}
			}
			return true
		},
		csiCalls: func() int { return int(calls.calls.Load()) },
		shutdown: factory.Shutdown,
	}, nil
}

func startObjController(ctx context.Context, client kubernetes.Interface, _ string) (*objRun, error) {
	factory := informers.NewSharedInformerFactory(client, 0)
	cfg := controller.DefaultConfig()
	c, err := controller.New(ctx, cfg, client, factory, &record.FakeRecorder{}, nil)
	if err != nil {
		return nil, err
	}
	core, storage := factory.Core().V1(), factory.Storage().V1()
	infs := map[string]cache.SharedIndexInformer{
		"Pod":     core.Pods().Informer(),
		"Node":    core.Nodes().Informer(),
		"PVC":     core.PersistentVolumeClaims().Informer(),
		"PV":      core.PersistentVolumes().Informer(),
		"VA":      storage.VolumeAttachments().Informer(),
		"CSINode": storage.CSINodes().Informer(),
	}
	return &objRun{
		informers: infs,
		records:   map[string]cache.TransformFunc{"Pod": controller.TrimPod},
		run: func(ctx context.Context) error {
			factory.Start(ctx.Done())
			return c.Run(ctx)
		},
		csiCalls: func() int { return 0 },
		shutdown: factory.Shutdown,
	}, nil
}

// countingCSI is a CSI client that fails every call and counts it: the
// world has every volume published, so the attacher has nothing to call.
type countingCSI struct{ calls atomic.Int64 }

var errObjCostCSI = errors.New("the per-object cost benchmark has no CSI driver")

func (c *countingCSI) ControllerPublish(context.Context, csi.PublishRequest) (map[string]string, error) {
	c.calls.Add(1)
	return nil, errObjCostCSI
}

func (c *countingCSI) ControllerUnpublish(context.Context, string, string, map[string]string) error {
	c.calls.Add(1)
	return errObjCostCSI
}

func (c *countingCSI) ListVolumes(context.Context, int32) (map[string][]string, error) {
	c.calls.Add(1)
	return nil, errObjCostCSI
}
