package stack

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/app"
	"github.com/latchcsi/latch/internal/attachdetach/controller"
	"github.com/latchcsi/latch/internal/attacher"
	"github.com/latchcsi/latch/internal/csimock"
)

// AttacherConfig is csi-attacher's configuration with the binary's flag
// defaults, talking to the API server through cfg (with the binary's
// client limits) and to the driver at csiAddress.
func AttacherConfig(cfg *rest.Config, csiAddress string) attacher.SidecarConfig {
	c := attacher.DefaultSidecarConfig()
	c.RESTConfig = rest.CopyConfig(cfg)
	c.RESTConfig.QPS, c.RESTConfig.Burst = attacher.DefaultKubeAPIQPS, attacher.DefaultKubeAPIBurst
	c.CSIAddress = csiAddress
	c.Metrics = attacherMetrics()
	return c
}

// attacherMetrics are csi-attacher's own metrics for every attacher this
// process runs, registered with the legacy registry once, as the binary
// registers its own: the registry is process-wide.
var attacherMetrics = sync.OnceValue(func() *attacher.Metrics {
	m := attacher.NewMetrics()
	m.Register(legacyregistry.MustRegister)
	return m
})

// Attacher runs csi-attacher's RunSidecar as a component named name.
func Attacher(ctx context.Context, name string, cfg attacher.SidecarConfig) *Component {
	return Go(ctx, name, func(ctx context.Context) error { return attacher.RunSidecar(ctx, cfg) })
}

// QuickAttacher shortens what csi-attacher makes a test wait: a CSI call
// times out after 5s, a failed attach is retried from 100ms, a missing
// secret looked for again every 500ms, and the driver connection is
// given 30s. Volumes without an fsType get ext4.
func QuickAttacher(c *attacher.SidecarConfig) {
	c.ConnectTimeout = 30 * time.Second
	c.DefaultFSType = "ext4"
	c.Controller.Timeout = 5 * time.Second
	c.Controller.RetryIntervalStart = 100 * time.Millisecond
	c.Controller.SecretRetryInterval = 500 * time.Millisecond
}

// QuickLease makes leader election hand over within seconds: a 4s Lease,
// renewed within 3s, tried every 200ms. The renew deadline is a hard stop
// (presence mode stops its work when no renewal has come back within it,
// however the renewal fails or hangs), so it leaves a loaded test machine,
// whose API server may take a second or more to answer one renewal, room
// to renew.
func QuickLease(l *app.LeaderElection) {
	l.LeaseDuration, l.RenewDeadline, l.RetryPeriod = 4*time.Second, 3*time.Second, 200*time.Millisecond
}

// RestartingAttacher is Attacher under a supervisor that restarts
// RunSidecar 200ms after it returns on its own (lost driver connection,
// lost Lease), as Kubernetes restarts the container; Restarts counts the
// restarts.
func RestartingAttacher(ctx context.Context, name string, cfg attacher.SidecarConfig) *Component {
	restarts := new(atomic.Int32)
	c := Go(ctx, name, func(ctx context.Context) error {
		logger := klog.FromContext(ctx)
		for {
			err := attacher.RunSidecar(ctx, cfg)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			logger.Info("csi-attacher exited, restarting", "err", err)
			restarts.Add(1)
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(200 * time.Millisecond):
			}
		}
	})
	c.restarts = restarts
	return c
}

// ControllerConfig is attachdetach-controller's configuration with the
// binary's flag defaults and client limits, except what a rig needs
// different: no leader election, no HTTP endpoint and a private metrics
// registry (a process-wide one refuses a second controller's metrics).
func ControllerConfig(cfg *rest.Config) controller.ServeConfig {
	c := controller.DefaultServeConfig()
	c.RESTConfig = rest.CopyConfig(cfg)
	c.RESTConfig.QPS, c.RESTConfig.Burst = controller.DefaultKubeAPIQPS, controller.DefaultKubeAPIBurst
	c.Leader.Enabled = false
	c.Registry = metrics.NewKubeRegistry()
	return c
}

// Controller runs controller.Serve as a component named name.
func Controller(ctx context.Context, name string, cfg controller.ServeConfig) *Component {
	return Go(ctx, name, func(ctx context.Context) error { return controller.Serve(ctx, cfg) })
}

// TrivialAttacher runs csi-attacher's controller in trivial mode for
// driver (every VolumeAttachment of the driver is marked attached; no CSI
// driver is called), as the binary does for a driver without
// PUBLISH_UNPUBLISH_VOLUME.
func TrivialAttacher(ctx context.Context, name string, client kubernetes.Interface, driver string) (*Component, error) {
	cfg := attacher.DefaultConfig()
	cfg.Driver = attacher.DriverInfo{Name: driver}
	cfg.Trivial = true
	factory := attacher.NewInformers(client, 0, driver)
	recorder, stopEvents := controller.NewEventRecorder(ctx, client)
	a, err := attacher.New(cfg, client, factory, nil, recorder, nil)
	if err != nil {
		stopEvents()
		return nil, fmt.Errorf("trivial attacher for %s: %w", driver, err)
	}
	return Go(ctx, name, func(ctx context.Context) error {
		defer stopEvents()
		defer factory.Shutdown()
		factory.Start(ctx.Done())
		return a.Run(ctx)
	}), nil
}

// MockDriver starts the mock CSI driver named name on socket (controller
// service only, volumes created on first use), adjusted by adjust.
func MockDriver(ctx context.Context, name, socket string, adjust func(*csimock.Config)) (*csimock.Driver, error) {
	cfg := csimock.DefaultConfig()
	cfg.Name = name
	cfg.NodeService = false
	cfg.AutoCreateVolumes = true
	if adjust != nil {
		adjust(&cfg)
	}
	d, err := csimock.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("mock driver %s: %w", name, err)
	}
	if err := d.Start(ctx, socket); err != nil {
		return nil, fmt.Errorf("mock driver %s on %s: %w", name, socket, err)
	}
	return d, nil
}
