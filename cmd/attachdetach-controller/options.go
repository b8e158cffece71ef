package main

import (
	"fmt"
	"time"

	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"

	"github.com/latchcsi/latch/internal/app"
	"github.com/latchcsi/latch/internal/attachdetach/controller"
	"github.com/latchcsi/latch/internal/attachdetach/volume"
)

// options are the command line, named like kube-controller-manager's
// flags for the same knobs. See docs/attachdetach-controller.md.
type options struct {
	kubeconfig         string
	showVersion        bool
	kubeAPIQPS         float64
	kubeAPIBurst       int
	kubeAPIContentType string

	leaderElect          bool
	leaseDuration        time.Duration
	renewDeadline        time.Duration
	retryPeriod          time.Duration
	leaderElectNamespace string
	leaderElectName      string

	workers                     int
	maxWaitForUnmount           time.Duration
	disableForceDetachOnTimeout bool
	reconcileSync               time.Duration
	// csiMigrationByNode holds the validated in-tree plugin names of
	// --csi-migration-by-node.
	csiMigrationByNode []string

	httpEndpoint   string
	healthEndpoint string
	metricsPath    string

	logging *logsapi.LoggingConfiguration
	gates   featuregate.MutableVersionedFeatureGate
}

// DefaultHTTPEndpoint listens on loopback only: metrics must be exposed
// deliberately. The Deployments keep it (reachable with kubectl
// port-forward) and serve the probes on --health-endpoint; the scrape
// overlay and the chart's attachdetachController.httpEndpoint set ":8080".
const DefaultHTTPEndpoint = "127.0.0.1:8080"

func parseOptions(args []string) (*options, error) {
	fs, err := app.NewFlags("attachdetach-controller", "A set of key=value pairs that describe feature gates for alpha/experimental features (logging gates).")
	if err != nil {
		return nil, err
	}
	o := &options{logging: fs.Logging, gates: fs.Gates}
	// Defaults come from controller.DefaultServeConfig, which rigs that
	// run the controller as the binary does use too.
	d := controller.DefaultServeConfig()
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "Path to a kubeconfig file. Required only when running out of cluster.")
	fs.BoolVar(&o.showVersion, "version", false, "Print the version and exit.")
	fs.Float64Var(&o.kubeAPIQPS, "kube-api-qps", controller.DefaultKubeAPIQPS, "QPS to use while talking with the API server.")
	fs.IntVar(&o.kubeAPIBurst, "kube-api-burst", controller.DefaultKubeAPIBurst, "Burst to use while talking with the API server.")
	fs.StringVar(&o.kubeAPIContentType, "kube-api-content-type", app.DefaultContentType, "Content type of requests sent to the API server.")
	fs.BoolVar(&o.leaderElect, "leader-elect", d.Leader.Enabled, "Elect a leader on a Lease before running the controller (run more than one replica for high availability).")
	fs.DurationVar(&o.leaseDuration, "leader-elect-lease-duration", d.Leader.LeaseDuration, "Duration non-leader candidates wait after observing a leadership renewal before trying to take over.")
	fs.DurationVar(&o.renewDeadline, "leader-elect-renew-deadline", d.Leader.RenewDeadline, "Duration the leader retries refreshing leadership before giving it up. Must be less than the lease duration.")
	fs.DurationVar(&o.retryPeriod, "leader-elect-retry-period", d.Leader.RetryPeriod, "Duration candidates wait between tries of actions.")
	fs.StringVar(&o.leaderElectNamespace, "leader-elect-resource-namespace", d.Leader.Namespace, "Namespace of the leader election Lease.")
	fs.StringVar(&o.leaderElectName, "leader-elect-resource-name", d.Leader.LeaseName, "Name of the leader election Lease.")
	fs.IntVar(&o.workers, "concurrent-attach-detach-syncs", d.Controller.Workers, "Number of (volume, node) keys reconciled in parallel.")
	fs.DurationVar(&o.maxWaitForUnmount, "max-wait-for-unmount", d.Controller.MaxWaitForUnmount, "How long a volume that no Pod wants any more but that a NotReady node still lists in volumesInUse waits before it is detached anyway.")
	fs.BoolVar(&o.disableForceDetachOnTimeout, "disable-force-detach-on-timeout", d.Controller.DisableForceDetachOnTimeout, "Never detach a volume still in use by a NotReady node after --max-wait-for-unmount (the out-of-service taint still detaches).")
	fs.DurationVar(&o.reconcileSync, "reconcile-sync", d.Controller.VerifyPeriod, "Period of the verify pass that compares the actual state with the VolumeAttachments; 0 disables it.")
	var migrationByNode string
	fs.StringVar(&migrationByNode, "csi-migration-by-node", "", "Comma-separated in-tree volume plugin names (e.g. kubernetes.io/gce-pd) whose CSI migration is not complete: their volumes are attached through CSI only on nodes whose CSINode lists the plugin in the storage.alpha.kubernetes.io/migrated-plugins annotation. Empty: every migration is complete (kube-controller-manager 1.36).")
	fs.StringVar(&o.httpEndpoint, "http-endpoint", DefaultHTTPEndpoint, "host:port of the HTTP server for metrics, /healthz and /healthz/leader-election; empty disables it.")
	fs.StringVar(&o.healthEndpoint, "health-endpoint", "", "host:port of an HTTP server for /healthz and /healthz/leader-election only, no metrics (for the kubelet's probes, e.g. :8081); empty disables it.")
	fs.StringVar(&o.metricsPath, "metrics-path", d.HTTP.MetricsPath, "HTTP path of the metrics.")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	switch {
	case o.workers <= 0:
		return nil, fmt.Errorf("--concurrent-attach-detach-syncs must be positive, got %d", o.workers)
	case o.maxWaitForUnmount <= 0:
		return nil, fmt.Errorf("--max-wait-for-unmount must be positive, got %s", o.maxWaitForUnmount)
	case o.reconcileSync < 0:
		return nil, fmt.Errorf("--reconcile-sync must not be negative, got %s", o.reconcileSync)
	case o.healthEndpoint != "" && o.healthEndpoint == o.httpEndpoint:
		return nil, fmt.Errorf("--health-endpoint and --http-endpoint must differ, both are %s", o.httpEndpoint)
	case o.leaderElect && o.renewDeadline >= o.leaseDuration:
		return nil, fmt.Errorf("--leader-elect-renew-deadline (%s) must be less than --leader-elect-lease-duration (%s)", o.renewDeadline, o.leaseDuration)
	}
	plugins, err := volume.ParseInTreePlugins(migrationByNode)
	if err != nil {
		return nil, fmt.Errorf("--csi-migration-by-node: %w", err)
	}
	o.csiMigrationByNode = plugins
	if err := app.ValidateContentType(o.kubeAPIContentType); err != nil {
		return nil, err
	}
	if err := fs.SetFeatureGates(); err != nil {
		return nil, err
	}
	return o, nil
}
