package main

import (
	"fmt"
	"time"

	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"

	"github.com/latchcsi/latch/internal/app"
	"github.com/latchcsi/latch/internal/attacher"
	"github.com/latchcsi/latch/internal/csi"
)

// options are the command line, with upstream external-attacher's flag
// names and meanings. Defaults differ only where docs/csi-attacher.md says so.
type options struct {
	// CommonOptions hold the client flags, --version, --metrics-path and
	// --leader-election with its timing; the Lease's namespace and labels
	// are set into its Leader too.
	app.CommonOptions

	csiAddress         string
	resync             time.Duration
	timeout            time.Duration
	workerThreads      int
	driverConcurrency  string
	apiWorkers         int
	maxEntries         int
	retryIntervalStart time.Duration
	retryIntervalMax   time.Duration
	reconcileSync      time.Duration
	reconcileTimeout   time.Duration
	reconcileMaxPages  int
	defaultFSType      string
	maxGRPCLogLength   int
	connectTimeout     time.Duration

	httpEndpoint   string
	metricsAddress string
	automaxprocs   bool
	maxProcs       int
	gcMinHeapMiB   int

	logging *logsapi.LoggingConfiguration
	gates   featuregate.MutableVersionedFeatureGate
	// gatesSet are the gates --feature-gates named (logUpstreamGates).
	gatesSet map[string]bool
}

func parseOptions(args []string) (*options, error) {
	// Go's flag package accepts -flag and --flag alike, as upstream does.
	fs, err := app.NewFlags("csi-attacher", "A set of key=value pairs that describe feature gates for alpha/experimental features.")
	if err != nil {
		return nil, err
	}
	// Defaults come from attacher.DefaultSidecarConfig, which rigs that
	// run the attacher as the binary does use too.
	d := attacher.DefaultSidecarConfig()
	labels := app.LabelsValue{}
	o := &options{
		CommonOptions: app.CommonOptions{
			Client: app.ClientOptions{QPS: attacher.DefaultKubeAPIQPS, Burst: attacher.DefaultKubeAPIBurst},
			Leader: d.Leader, MetricsPath: d.HTTP.MetricsPath,
		},
		logging: fs.Logging, gates: fs.Gates,
	}
	o.Leader.Labels = labels
	if err := fs.Gates.Add(upstreamGates); err != nil {
		return nil, err
	}
	fs.ListFeatureGatesInHelp()
	fs.AddCommonFlags("leader-election", &o.CommonOptions)
	fs.StringVar(&o.csiAddress, "csi-address", d.CSIAddress, "Address of the CSI driver socket.")
	fs.DurationVar(&o.resync, "resync", d.Resync, "Resync interval of the informers: every VolumeAttachment is re-checked this often.")
	fs.DurationVar(&o.timeout, "timeout", d.Controller.Timeout, "Timeout of one ControllerPublish/ControllerUnpublish call.")
	fs.IntVar(&o.workerThreads, "worker-threads", d.Controller.Workers, "The most ControllerPublish and ControllerUnpublish calls in flight at once, attaches and detaches together (while both wait, each gets half); also the PV queue's workers. With --driver-concurrency=adaptive an upper bound (upstream default: 10).")
	fs.StringVar(&o.driverConcurrency, "driver-concurrency", attacher.ConcurrencyAdaptive, "How many driver calls run at once: adaptive (the limit follows the backend: it grows while call latency stays flat, backs off when the driver answers ResourceExhausted or Unavailable or latency rises; at most --worker-threads) or fixed (always --worker-threads). latch only.")
	fs.IntVar(&o.apiWorkers, "api-worker-threads", d.Controller.APIWorkers, "VolumeAttachments worked on at once per attach and detach queue; those not calling the driver do their API writes meanwhile. 0 means 200, or 2 × --worker-threads when that is more. latch only.")
	fs.IntVar(&o.maxEntries, "max-entries", d.Controller.MaxEntries, "max_entries of each ListVolumes page; 0 lets the driver choose.")
	fs.DurationVar(&o.retryIntervalStart, "retry-interval-start", d.Controller.RetryIntervalStart, "Initial retry interval of a failed attach or detach; it doubles with every failure up to --retry-interval-max.")
	fs.DurationVar(&o.retryIntervalMax, "retry-interval-max", d.Controller.RetryIntervalMax, "Maximum retry interval of a failed attach or detach.")
	fs.DurationVar(&o.reconcileSync, "reconcile-sync", d.Controller.ReconcileSync, "Period of the ListVolumes reconcile (only with LIST_VOLUMES and LIST_VOLUMES_PUBLISHED_NODES); 0 disables it.")
	fs.DurationVar(&o.reconcileTimeout, "reconcile-timeout", d.Controller.ReconcileTimeout, "Timeout of one whole ListVolumes reconcile (all pages). latch only.")
	fs.IntVar(&o.reconcileMaxPages, "reconcile-max-pages", csi.DefaultListVolumesMaxPages, "Most pages one ListVolumes reconcile reads; a driver that returns a next_token on every page beyond that fails the reconcile. latch only.")
	fs.StringVar(&o.defaultFSType, "default-fstype", d.DefaultFSType, "Filesystem type used when a PV names none (mount volumes only).")
	fs.IntVar(&o.maxGRPCLogLength, "max-grpc-log-length", -1, "Maximum length of logged gRPC requests and responses; negative means no limit.")
	fs.DurationVar(&o.connectTimeout, "csi-connect-timeout", d.ConnectTimeout, "How long to keep trying to connect to the driver at start-up. latch only.")
	fs.StringVar(&o.Leader.Namespace, "leader-election-namespace", "", "Namespace of the leader election Lease; default: the Pod's namespace.")
	fs.Var(labels, "leader-election-labels", "Labels for the Lease, as key:value pairs separated by commas (external-attacher's form, e.g. 'my-label:my-value,my-second-label:my-second-value'); key=value is accepted too.")
	fs.StringVar(&o.httpEndpoint, "http-endpoint", "", "host:port of the HTTP server for metrics and /healthz/leader-election; empty disables it.")
	fs.StringVar(&o.metricsAddress, "metrics-address", "", "(deprecated) host:port for metrics only; use --http-endpoint.")
	fs.BoolVar(&o.automaxprocs, "automaxprocs", false, "Set GOMAXPROCS from the container's CPU quota.")
	fs.IntVar(&o.maxProcs, "max-procs", DefaultMaxProcs, "GOMAXPROCS of the sidecar: how many cores run its Go code at once. 0 keeps Go's own default (the container's CPU limit, else every core). The GOMAXPROCS environment variable and --automaxprocs take precedence. latch only.")
	fs.IntVar(&o.gcMinHeapMiB, "gc-min-heap-mib", DefaultGCMinHeapMiB, "The heap size in MiB below which the garbage collector does not run: a live heap under half of it is collected only when the heap reaches it (at most five times the live heap), a larger one as GOGC says (Go's default doubles it). 0 (the default) leaves Go's own pace. Setting the GOGC environment variable turns it off; the soft memory limit (GOMEMLIMIT, else 90 % of the container's memory limit) still caps the heap. latch only.")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if o.httpEndpoint != "" && o.metricsAddress != "" {
		return nil, fmt.Errorf("only one of --http-endpoint and --metrics-address may be set")
	}
	if o.apiWorkers < 0 {
		return nil, fmt.Errorf("--api-worker-threads must not be negative, got %d", o.apiWorkers)
	}
	if o.reconcileMaxPages <= 0 {
		return nil, fmt.Errorf("--reconcile-max-pages must be positive, got %d", o.reconcileMaxPages)
	}
	if o.maxProcs < 0 {
		return nil, fmt.Errorf("--max-procs must not be negative, got %d", o.maxProcs)
	}
	if o.gcMinHeapMiB < 0 {
		return nil, fmt.Errorf("--gc-min-heap-mib must not be negative, got %d", o.gcMinHeapMiB)
	}
	if o.workerThreads <= 0 {
		return nil, fmt.Errorf("--worker-threads must be positive, got %d", o.workerThreads)
	}
	if o.driverConcurrency != attacher.ConcurrencyAdaptive && o.driverConcurrency != attacher.ConcurrencyFixed {
		return nil, fmt.Errorf("--driver-concurrency must be %s or %s, got %q", attacher.ConcurrencyAdaptive, attacher.ConcurrencyFixed, o.driverConcurrency)
	}
	if o.timeout <= 0 {
		return nil, fmt.Errorf("--timeout must be positive, got %s", o.timeout)
	}
	if err := fs.SetFeatureGates(); err != nil {
		return nil, err
	}
	o.gatesSet = fs.FeatureGatesSet()
	return o, nil
}
