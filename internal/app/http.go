package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"
)

// HTTPConfig configures the metrics and health endpoint.
type HTTPConfig struct {
	// Address to listen on ("" disables the endpoint).
	Address     string
	MetricsPath string // default /metrics
	// LeaderWatchdog, when set, serves /healthz/leader-election: it fails
	// when this replica leads but has not renewed its lease in time.
	LeaderWatchdog *leaderelection.HealthzAdaptor
	// RegisterMetrics installs the metrics handler on mux at path. Nil
	// serves component-base's legacy registry.
	RegisterMetrics func(mux *http.ServeMux, path string)
	// Extra handlers, by path.
	Handlers map[string]http.Handler
	// HealthOnly serves /healthz and /healthz/leader-election only, no
	// metrics: an endpoint the kubelet's probes can reach on the Pod's
	// interfaces without exposing metrics there.
	HealthOnly bool
	// Flag names the address's command line flag in errors; default
	// --http-endpoint.
	Flag string
}

// ServeHTTP serves metrics (component-base's legacy registry, which holds
// the workqueue, csi-lib-utils and our own metrics) and health checks until
// ctx is done. The listener is opened before it returns so that a bad
// address fails start-up; serving runs in the background.
func ServeHTTP(ctx context.Context, cfg HTTPConfig) (net.Addr, error) {
	if cfg.Address == "" {
		return nil, nil
	}
	if cfg.MetricsPath == "" {
		cfg.MetricsPath = "/metrics"
	}
	if cfg.Flag == "" {
		cfg.Flag = "--http-endpoint"
	}
	mux := http.NewServeMux()
	switch {
	case cfg.HealthOnly:
	case cfg.RegisterMetrics != nil:
		cfg.RegisterMetrics(mux, cfg.MetricsPath)
	default:
		mux.Handle(cfg.MetricsPath, legacyregistry.Handler())
	}
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	if cfg.LeaderWatchdog != nil {
		mux.HandleFunc("/healthz/leader-election", func(w http.ResponseWriter, r *http.Request) {
			if err := cfg.LeaderWatchdog.Check(r); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			fmt.Fprintln(w, "ok")
		})
	}
	for path, h := range cfg.Handlers {
		mux.Handle(path, h)
	}
	ln, err := net.Listen("tcp", cfg.Address)
	if err != nil {
		return nil, fmt.Errorf("listen on %s %s: %w", cfg.Flag, cfg.Address, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	logger := klog.FromContext(ctx)
	go func() {
		<-ctx.Done()
		shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
	}()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error(err, "HTTP endpoint stopped", "address", cfg.Address)
		}
	}()
	if cfg.HealthOnly {
		logger.Info("Serving health", "address", ln.Addr().String(), "flag", cfg.Flag)
	} else {
		logger.Info("Serving metrics and health", "address", ln.Addr().String(), "metricsPath", cfg.MetricsPath)
	}
	return ln.Addr(), nil
}
