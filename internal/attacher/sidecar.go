package attacher

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/app"
	"github.com/latchcsi/latch/internal/csi"
	"github.com/latchcsi/latch/internal/kube"
)

// SidecarConfig is everything the csi-attacher process needs; cmd/ fills it
// from flags. Tests run the same RunSidecar in-process.
type SidecarConfig struct {
	RESTConfig     *rest.Config
	CSIAddress     string
	ConnectTimeout time.Duration
	Resync         time.Duration
	DefaultFSType  string
	Controller     Config // Driver, Trivial and Clock are filled in by RunSidecar
	Leader         app.LeaderElection
	HTTP           app.HTTPConfig
	// Ready, when set, receives the HTTP endpoint's address once serving
	// (nil when disabled); for tests.
	Ready func(httpAddr net.Addr)
	// MetricsGatherer is what the HTTP endpoint serves beside
	// csi_sidecar_operations_seconds; nil: component-base's legacy
	// registry, as the binary. latch-local, which runs both controllers
	// and the API server in one process, serves the attacher's part only.
	MetricsGatherer prometheus.Gatherer
	// MaxGRPCLogLength caps each logged CSI request and answer
	// (--max-grpc-log-length); 0 or less: no cap.
	MaxGRPCLogLength int
	// ListVolumesMaxPages is the page budget of one ListVolumes reconcile
	// (--reconcile-max-pages); 0: csi.DefaultListVolumesMaxPages.
	ListVolumesMaxPages int
	// Metrics are the attacher's own metrics (latch_attacher_*), made and
	// registered by the process that runs it, once (cmd/csi-attacher with
	// the legacy registry; internal/stack for latch-local and the tests,
	// which run several attachers in one process); nil records none.
	Metrics *Metrics
}

// ErrDriverConnectionLost is returned when the connection to the CSI
// driver is lost after start-up; the process exits so Kubernetes restarts
// the container, as upstream's does.
var ErrDriverConnectionLost = errors.New("lost connection to the CSI driver")

// RunSidecar connects to the driver, discovers it, and runs the attacher
// (under leader election when enabled) until ctx is done.
func RunSidecar(ctx context.Context, cfg SidecarConfig) error {
	logger := klog.FromContext(ctx)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	gatherer := cfg.MetricsGatherer
	if gatherer == nil {
		gatherer = legacyregistry.DefaultGatherer
	}
	metricsManager := newCSIOpsMetrics(gatherer)
	client0, err := csi.Connect(ctx, csi.Options{
		Address: cfg.CSIAddress, ConnectTimeout: cfg.ConnectTimeout,
		CallTimeout: cfg.Controller.Timeout, MetricsManager: metricsManager,
		MaxLogLength: cfg.MaxGRPCLogLength, ListVolumesMaxPages: cfg.ListVolumesMaxPages,
	})
	if err != nil {
		return fmt.Errorf("connect to CSI driver at %s: %w", cfg.CSIAddress, err)
	}
	defer client0.Close()
	go func() {
		select {
		case <-client0.Lost():
			cancel(ErrDriverConnectionLost)
		case <-ctx.Done():
		}
	}()

	facts, err := DiscoverDriver(ctx, client0, cfg.Controller.Timeout)
	if err != nil {
		return err
	}
	metricsManager.SetDriverName(facts.Info.Name)
	facts.Info.DefaultFSType = cfg.DefaultFSType

	client, err := kubernetes.NewForConfig(app.ComponentConfig(cfg.RESTConfig, "csi-attacher"))
	if err != nil {
		return fmt.Errorf("create API client: %w", err)
	}
	leaseClient, err := app.LeaseClient(cfg.RESTConfig, "csi-attacher")
	if err != nil {
		return fmt.Errorf("create API client: %w", err)
	}

	watchdog := leaderelection.NewLeaderHealthzAdaptor(20 * time.Second)
	if cfg.Leader.Enabled {
		cfg.HTTP.LeaderWatchdog = watchdog
	} else {
		watchdog = nil
	}
	cfg.HTTP.RegisterMetrics = func(mux *http.ServeMux, path string) { metricsManager.RegisterToServer(mux, path) }
	addr, err := app.ServeHTTP(ctx, cfg.HTTP)
	if err != nil {
		return err
	}
	if cfg.Ready != nil {
		cfg.Ready(addr)
	}

	ctrlCfg := cfg.Controller
	ctrlCfg.Driver = facts.Info
	ctrlCfg.Trivial = facts.Trivial
	if !facts.ListVolumesPublished {
		ctrlCfg.ReconcileSync = 0
	}
	if ctrlCfg.OrphanNamespace == "" {
		ctrlCfg.OrphanNamespace = OrphanNamespace(cfg.Leader.Namespace)
	}
	if p := cfg.Leader.Presence; p != nil && p.Competing == nil {
		// latch_attacher_competing_instances, with the attacher's other
		// metrics, in the registry of the process that runs it.
		withGauge := *p
		if g := cfg.Metrics.competingGauge(); g != nil {
			withGauge.Competing = g
		}
		cfg.Leader.Presence = &withGauge
	}
	if cfg.Leader.LeaseName == "" {
		cfg.Leader.LeaseName = kube.LeaseName(facts.Info.Name)
	}

	if cfg.Leader.Enabled {
		// The elector's LeaderElection events, from a broadcaster of
		// their own with csi-lib-utils' source: the Lease name before it
		// is made a valid object name, "/", the identity.
		if cfg.Leader.Identity == "" {
			cfg.Leader.Identity = app.DefaultIdentity()
		}
		// It outlives ctx: the elector records "stopped leading" when it
		// releases the Lease, after ctx is done and the workers drained.
		leaderEvents := kube.StartEvents(ctx, client)
		defer leaderEvents.Stop()
		cfg.Leader.Recorder = leaderEvents.NewRecorder(v1.EventSource{Component: "external-attacher-leader-" + facts.Info.Name + "/" + cfg.Leader.Identity})
	}

	run := func(ctx context.Context) error {
		factory := NewInformers(client, cfg.Resync, facts.Info.Name)
		// Stopped after ctrl.Run returned: the work that drains after ctx
		// is done still records events.
		events := kube.StartEvents(ctx, client)
		defer events.Stop()
		recorder := events.NewRecorder(v1.EventSource{Component: "csi-attacher " + facts.Info.Name})
		ctrl, err := New(ctrlCfg, client, factory, client0, recorder, cfg.Metrics)
		if err != nil {
			return err
		}
		// A second attacher in the same process (tests) finds the
		// collectors taken; the first one keeps reporting.
		for _, r := range ctrl.Backlogs() {
			_ = legacyregistry.CustomRegister(r.BacklogCollector())
		}
		_ = legacyregistry.CustomRegister(ctrl.CallWaitCollector())
		factory.Start(ctx.Done())
		defer factory.Shutdown()
		return ctrl.Run(ctx)
	}
	err = app.RunAsLeader(ctx, leaseClient, cfg.Leader, watchdog, run)
	if cause := context.Cause(ctx); errors.Is(cause, ErrDriverConnectionLost) {
		return cause
	}
	if errors.Is(err, context.Canceled) {
		logger.Info("csi-attacher stopped")
		return nil
	}
	return err
}
