// Command csi-attacher is latch's drop-in replacement for the Kubernetes
// CSI external-attacher sidecar. See docs/csi-attacher.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"syscall"

	"go.uber.org/automaxprocs/maxprocs"
	"k8s.io/component-base/logs"
	logsapi "k8s.io/component-base/logs/api/v1"
	_ "k8s.io/component-base/logs/json/register" // --logging-format=json
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/app"
	"github.com/latchcsi/latch/internal/attacher"
	"github.com/latchcsi/latch/internal/runner"
	"github.com/latchcsi/latch/internal/version"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	opts, err := parseOptions(args)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "csi-attacher:", err)
		return 2
	}
	if opts.ShowVersion {
		fmt.Println(os.Args[0], version.Version)
		return 0
	}
	logs.InitLogs()
	defer logs.FlushLogs()
	if err := logsapi.ValidateAndApply(opts.logging, opts.gates); err != nil {
		fmt.Fprintln(os.Stderr, "csi-attacher:", err)
		return 2
	}
	switch procs, source := procsFor(os.Getenv("GOMAXPROCS"), opts.automaxprocs, opts.maxProcs); {
	case source == procsFromQuota:
		undo, err := maxprocs.Set(maxprocs.Logger(klog.Infof))
		if err != nil {
			klog.ErrorS(err, "Failed to set GOMAXPROCS from the CPU quota")
		}
		defer undo()
	case procs > 0:
		runtime.GOMAXPROCS(procs)
		klog.V(2).InfoS("Set GOMAXPROCS", "gomaxprocs", procs, "from", source)
	default:
		klog.V(2).InfoS("Kept GOMAXPROCS", "gomaxprocs", runtime.GOMAXPROCS(0), "from", source)
	}
	if floor, source := gcFloorFor(os.Getenv("GOGC"), opts.gcMinHeapMiB); floor > 0 {
		f := startGCFloor(floor)
		klog.V(2).InfoS("Raised the garbage collector's minimum heap", "minHeapMiB", opts.gcMinHeapMiB, "gogc", f.base, "from", source)
	} else {
		klog.V(2).InfoS("Kept Go's garbage collector pace", "from", source)
	}
	logUpstreamGates(klog.Background(), opts.gatesSet)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx, restConfig, err := app.Start(ctx, "csi-attacher", opts.Client)
	if err != nil {
		return 1
	}
	logger := klog.FromContext(ctx)

	httpAddr := opts.httpEndpoint
	if httpAddr == "" {
		httpAddr = opts.metricsAddress
	}
	// The binary's metrics, registered with the registry its HTTP
	// endpoint serves before anything records into them.
	metrics := attacher.NewMetrics()
	metrics.Register(legacyregistry.MustRegister)
	queueMetrics := runner.NewQueueMetrics()
	queueMetrics.Register(legacyregistry.MustRegister)
	err = attacher.RunSidecar(ctx, attacher.SidecarConfig{
		RESTConfig:          restConfig,
		CSIAddress:          opts.csiAddress,
		ConnectTimeout:      opts.connectTimeout,
		MaxGRPCLogLength:    opts.maxGRPCLogLength,
		ListVolumesMaxPages: opts.reconcileMaxPages,
		Resync:              opts.resync,
		DefaultFSType:       opts.defaultFSType,
		Controller: attacher.Config{
			Workers:            opts.workerThreads,
			DriverConcurrency:  opts.driverConcurrency,
			APIWorkers:         opts.apiWorkers,
			Timeout:            opts.timeout,
			RetryIntervalStart: opts.retryIntervalStart,
			RetryIntervalMax:   opts.retryIntervalMax,
			ReconcileSync:      opts.reconcileSync,
			ReconcileTimeout:   opts.reconcileTimeout,
			MaxEntries:         opts.maxEntries,
			QueueMetrics:       queueMetrics,
		},
		Leader:  leaderConfig(opts),
		HTTP:    app.HTTPConfig{Address: httpAddr, MetricsPath: opts.MetricsPath},
		Metrics: metrics,
	})
	if err != nil {
		logger.Error(err, "csi-attacher failed")
		return 1
	}
	return 0
}

// leaderConfig is the Lease configuration of the flags. Without
// --leader-election the attacher still holds its driver's Lease while it
// works and refuses to work while another identity holds it
// (app.Presence; docs/csi-attacher.md, "Leader election"). The Pod's UID
// (POD_UID, from the downward API) lets a restarted container take the
// Lease of its previous process over at once.
func leaderConfig(opts *options) app.LeaderElection {
	le := opts.Leader
	le.Presence = &app.Presence{Component: "csi-attacher", PodUID: os.Getenv("POD_UID")}
	return le
}
