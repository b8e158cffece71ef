package controller

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/app"
	"github.com/latchcsi/latch/internal/kube"
)

// EventComponent is the source component of the controller's events,
// kube-controller-manager's name for its attach/detach controller.
const EventComponent = "attachdetach-controller"

// ServeConfig is everything the binary configures.
type ServeConfig struct {
	RESTConfig *rest.Config
	Controller Config
	Leader     app.LeaderElection
	HTTP       app.HTTPConfig
	// HealthAddress, when set, serves /healthz and /healthz/leader-election
	// (no metrics) on a listener of its own (--health-endpoint), for the
	// kubelet's probes while HTTP stays on loopback.
	HealthAddress string
	// Registry receives the controller's metrics and queue backlog
	// collectors: the global registry in the binary (HTTP serves the legacy
	// registry), a private metrics.KubeRegistry in tests, since a registry
	// refuses a second registration of the same metric.
	Registry Registry
}

// NewEventRecorder returns a recorder that sends events to the API
// server as EventComponent, and a function that stops it once nothing
// records any more (sending what is queued; see kube.Events). The
// recorder outlives ctx: the workers drain and the Lease is released
// after ctx is done, and both still record events.
func NewEventRecorder(ctx context.Context, client kubernetes.Interface) (record.EventRecorder, func()) {
	ev := kube.StartEvents(ctx, client)
	ev.LogEvents(3)
	return ev.NewRecorder(v1.EventSource{Component: EventComponent}), ev.Stop
}

// Serve runs the controller process: metrics and health endpoint, events,
// leader election, informers and workers, until ctx is done (clean
// shutdown) or the lease is lost (app.ErrLostLease).
func Serve(ctx context.Context, cfg ServeConfig) error {
	logger := klog.FromContext(ctx)
	client, err := kubernetes.NewForConfig(app.ComponentConfig(cfg.RESTConfig, EventComponent))
	if err != nil {
		return fmt.Errorf("build API client: %w", err)
	}
	leaseClient, err := app.LeaseClient(cfg.RESTConfig, EventComponent)
	if err != nil {
		return fmt.Errorf("build API client: %w", err)
	}
	m := NewMetrics()
	if cfg.Registry != nil {
		m.Register(cfg.Registry)
	}
	var watchdog *leaderelection.HealthzAdaptor
	if cfg.Leader.Enabled {
		watchdog = leaderelection.NewLeaderHealthzAdaptor(20 * time.Second)
	}
	cfg.HTTP.LeaderWatchdog = watchdog
	if _, err := app.ServeHTTP(ctx, cfg.HTTP); err != nil {
		return err
	}
	health := app.HTTPConfig{Address: cfg.HealthAddress, HealthOnly: true, Flag: "--health-endpoint", LeaderWatchdog: watchdog}
	if _, err := app.ServeHTTP(ctx, health); err != nil {
		return err
	}
	recorder, stopEvents := NewEventRecorder(ctx, client)
	defer stopEvents()
	if cfg.Leader.Enabled {
		cfg.Leader.Recorder = recorder
	}
	return app.RunAsLeader(ctx, leaseClient, cfg.Leader, watchdog, func(ctx context.Context) error {
		// Resync 0: the controller is event-driven; the verify pass is
		// the safety net.
		factory := informers.NewSharedInformerFactory(client, 0)
		c, err := New(ctx, cfg.Controller, client, factory, recorder, m)
		if err != nil {
			return err
		}
		if cfg.Registry != nil {
			cfg.Registry.CustomMustRegister(c.BacklogCollectors()...)
		}
		factory.Start(ctx.Done())
		defer factory.Shutdown()
		err = c.Run(ctx)
		logger.Info("Controller stopped", "err", err)
		return err
	})
}
