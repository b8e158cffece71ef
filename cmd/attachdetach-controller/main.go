// Command attachdetach-controller is latch's replacement for
// kube-controller-manager's attach/detach controller, for CSI volumes.
// Run it beside kube-controller-manager started with
// --controllers=*,-attachdetach. See docs/attachdetach-controller.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/component-base/logs"
	logsapi "k8s.io/component-base/logs/api/v1"
	_ "k8s.io/component-base/logs/json/register" // --logging-format=json
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/app"
	"github.com/latchcsi/latch/internal/attachdetach/controller"
	"github.com/latchcsi/latch/internal/runner"
	"github.com/latchcsi/latch/internal/version"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run parses args, runs the controller until ctx is done and returns the
// exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	opts, err := parseOptions(args)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "attachdetach-controller:", err)
		return 2
	}
	if opts.ShowVersion {
		fmt.Fprintln(stdout, "attachdetach-controller", version.Version)
		return 0
	}
	logs.InitLogs()
	defer logs.FlushLogs()
	if err := logsapi.ValidateAndApply(opts.logging, opts.gates); err != nil {
		fmt.Fprintln(stderr, "attachdetach-controller:", err)
		return 2
	}
	ctx, restConfig, err := app.Start(ctx, "attachdetach-controller", opts.Client)
	if err != nil {
		return 1
	}
	logger := klog.FromContext(ctx)

	// The workqueue_* metrics of the controller's queues, registered with
	// the registry its HTTP endpoint serves.
	queueMetrics := runner.NewQueueMetrics()
	queueMetrics.Register(legacyregistry.MustRegister)
	err = controller.Serve(ctx, controller.ServeConfig{
		RESTConfig: restConfig,
		Controller: controller.Config{
			Workers:                     opts.workers,
			NodeStatusWorkers:           opts.nodeStatusWorkers,
			MaxWaitForUnmount:           opts.maxWaitForUnmount,
			DisableForceDetachOnTimeout: opts.disableForceDetachOnTimeout,
			VerifyPeriod:                opts.reconcileSync,
			MigrationByNode:             opts.csiMigrationByNode,
			CoexistencePeriod:           opts.coexistencePeriod,
			QueueMetrics:                queueMetrics,
		},
		Leader:        opts.Leader,
		HTTP:          app.HTTPConfig{Address: opts.httpEndpoint, MetricsPath: opts.MetricsPath},
		HealthAddress: opts.healthEndpoint,
		Registry:      legacyRegistry{},
	})
	if err != nil {
		logger.Error(err, "attachdetach-controller failed")
		return 1
	}
	logger.Info("attachdetach-controller stopped")
	return 0
}

// legacyRegistry registers the controller's metrics in component-base's
// global registry, which the binary's HTTP endpoint serves: the binary
// decides where metrics go, the controller package registers nothing.
type legacyRegistry struct{}

var _ controller.Registry = legacyRegistry{}

func (legacyRegistry) MustRegister(ms ...metrics.Registerable) { legacyregistry.MustRegister(ms...) }

func (legacyRegistry) CustomMustRegister(cs ...metrics.StableCollector) {
	legacyregistry.CustomMustRegister(cs...)
}
