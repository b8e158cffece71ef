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

// options are the command line: kube-controller-manager's flag names where
// it has the same knob (client, leader election, logging,
// --disable-force-detach-on-timeout), latch's own names elsewhere. See
// docs/attachdetach-controller.md, which says which are which.
type options struct {
	// CommonOptions hold the client flags, --version, --metrics-path and
	// --leader-elect with its timing; the Lease's namespace and name are
	// set into its Leader too.
	app.CommonOptions

	workers                     int
	nodeStatusWorkers           int
	maxWaitForUnmount           time.Duration
	disableForceDetachOnTimeout bool
	reconcileSync               time.Duration
	// csiMigrationByNode holds the validated in-tree plugin names of
	// --csi-migration-by-node.
	csiMigrationByNode []string
	coexistencePeriod  time.Duration

	httpEndpoint   string
	healthEndpoint string

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
	fs.ListFeatureGatesInHelp()
	// Defaults come from controller.DefaultServeConfig, which rigs that
	// run the controller as the binary does use too.
	d := controller.DefaultServeConfig()
	o := &options{
		CommonOptions: app.CommonOptions{
			Client: app.ClientOptions{QPS: controller.DefaultKubeAPIQPS, Burst: controller.DefaultKubeAPIBurst},
			Leader: d.Leader, MetricsPath: d.HTTP.MetricsPath,
		},
		logging: fs.Logging, gates: fs.Gates,
	}
	fs.AddCommonFlags("leader-elect", &o.CommonOptions)
	fs.StringVar(&o.Leader.Namespace, "leader-elect-resource-namespace", d.Leader.Namespace, "Namespace of the leader election Lease.")
	fs.StringVar(&o.Leader.LeaseName, "leader-elect-resource-name", d.Leader.LeaseName, "Name of the leader election Lease.")
	fs.IntVar(&o.workers, "concurrent-attach-detach-syncs", d.Controller.Workers, "Number of (volume, node) keys reconciled in parallel.")
	fs.IntVar(&o.nodeStatusWorkers, "node-status-workers", d.Controller.NodeStatusWorkers, "Number of nodes whose status.volumesAttached is written in parallel (one write per node at a time).")
	fs.DurationVar(&o.maxWaitForUnmount, "max-wait-for-unmount", d.Controller.MaxWaitForUnmount, "How long a volume that no Pod wants any more but that a NotReady node still lists in volumesInUse waits before it is detached anyway.")
	fs.BoolVar(&o.disableForceDetachOnTimeout, "disable-force-detach-on-timeout", d.Controller.DisableForceDetachOnTimeout, "Never detach a volume still in use by a NotReady node after --max-wait-for-unmount (the out-of-service taint still detaches).")
	fs.DurationVar(&o.reconcileSync, "reconcile-sync", d.Controller.VerifyPeriod, "Period of the verify pass that compares the actual state with the VolumeAttachments; 0 disables it.")
	fs.DurationVar(&o.coexistencePeriod, "coexistence-report-period", d.Controller.CoexistencePeriod, "How long latch_attachdetach_competing_controllers stays 1 after another attach/detach controller was last seen writing (a VolumeAttachment created, a node's status.volumesAttached changed, by a field manager not latch's), and how often at most that is logged at error level and evented; 0 disables the check.")
	var migrationByNode string
	fs.StringVar(&migrationByNode, "csi-migration-by-node", "", "Comma-separated in-tree volume plugin names (e.g. kubernetes.io/gce-pd) whose CSI migration is not complete: their volumes are attached through CSI only on nodes whose CSINode lists the plugin in the storage.alpha.kubernetes.io/migrated-plugins annotation. Empty: every migration is complete (kube-controller-manager 1.36).")
	fs.StringVar(&o.httpEndpoint, "http-endpoint", DefaultHTTPEndpoint, "host:port of the HTTP server for metrics, /healthz and /healthz/leader-election; empty disables it.")
	fs.StringVar(&o.healthEndpoint, "health-endpoint", "", "host:port of an HTTP server for /healthz and /healthz/leader-election only, no metrics (for the kubelet's probes, e.g. :8081); empty disables it.")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	switch {
	case o.workers <= 0:
		return nil, fmt.Errorf("--concurrent-attach-detach-syncs must be positive, got %d", o.workers)
	case o.nodeStatusWorkers <= 0:
		return nil, fmt.Errorf("--node-status-workers must be positive, got %d", o.nodeStatusWorkers)
	case o.maxWaitForUnmount <= 0:
		return nil, fmt.Errorf("--max-wait-for-unmount must be positive, got %s", o.maxWaitForUnmount)
	case o.coexistencePeriod < 0:
		return nil, fmt.Errorf("--coexistence-report-period must not be negative, got %s", o.coexistencePeriod)
	case o.reconcileSync < 0:
		return nil, fmt.Errorf("--reconcile-sync must not be negative, got %s", o.reconcileSync)
	case o.healthEndpoint != "" && o.healthEndpoint == o.httpEndpoint:
		return nil, fmt.Errorf("--health-endpoint and --http-endpoint must differ, both are %s", o.httpEndpoint)
	}
	plugins, err := volume.ParseInTreePlugins(migrationByNode)
	if err != nil {
		return nil, fmt.Errorf("--csi-migration-by-node: %w", err)
	}
	o.csiMigrationByNode = plugins
	if err := fs.SetFeatureGates(); err != nil {
		return nil, err
	}
	return o, nil
}
