// Package latchlocal assembles the whole attach/detach path in one process:
// the in-process control plane, simulated nodes, the mock CSI driver, the
// csi-attacher sidecar and the attach/detach controller. cmd/latch-local
// and the end-to-end tests use it. The controllers run in-process through
// the same entry points their binaries use (attacher.RunSidecar), so what
// runs here is the production code, not a copy.
package latchlocal

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/app"
	"github.com/latchcsi/latch/internal/attacher"
	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/localcluster"
	"github.com/latchcsi/latch/internal/stack"
)

// Options configure Start.
type Options struct {
	Nodes  int    // simulated nodes, named node-1 … node-N
	Driver string // CSI driver name
	// PublishLatency / UnpublishLatency delay the mock driver's calls.
	PublishLatency   time.Duration
	UnpublishLatency time.Duration
	// Backend, when set, models a storage backend behind the mock
	// driver's publish and unpublish (csimock.Backend).
	Backend *csimock.Backend
	// PublishFailures makes the first N ControllerPublish calls fail with
	// Unavailable, to watch the retry path.
	PublishFailures int64
	// Kubeconfig is where to write the admin kubeconfig ("" = don't).
	Kubeconfig string
	// DataDir keeps the cluster's data ("" = temporary).
	DataDir string
	// NoAttachDetachController leaves the attach/detach controller out.
	NoAttachDetachController bool
	// AttacherMetricsAddress and ControllerMetricsAddress are where
	// csi-attacher and the attach/detach controller serve their metrics
	// (host:port; "" serves none). See metrics.go for what each serves.
	AttacherMetricsAddress   string
	ControllerMetricsAddress string
	// EtcdLogOutput: see localcluster.Options.
	EtcdLogOutput string
	// RealNodes runs the real kube-scheduler, kube-controller-manager and
	// one hollow kubelet per node instead of the kubelet stand-in
	// (realnodes.go). Without it, kube-controller-manager runs only its
	// PV binder (StandInControllers), so that claims bind as in a cluster.
	RealNodes bool
	// ProcessOutput receives the logs of the child processes latch-local
	// starts (nil: discarded).
	ProcessOutput io.Writer
	// Upstream starts upstream's external-attacher and
	// kube-controller-manager's attach/detach controller instead of
	// latch's controllers, and serves `latch-local start|stop|restart`
	// (upstream.go, control.go). It needs RealNodes.
	Upstream bool
}

// Env is a running local system.
type Env struct {
	Cluster *localcluster.Cluster
	Client  kubernetes.Interface
	Kubelet *localcluster.Kubelet
	Driver  *csimock.Driver
	Opts    Options
	Socket  string

	// Hollow are the hollow kubelets (RealNodes), Kubelet the stand-in
	// (otherwise).
	Hollow []*stack.HollowNode

	stack   *stack.Stack
	nodeDir string

	// mu guards up (upstream mode's components).
	mu sync.Mutex
	up *upstreamState
	// errs carries the stack's errors and those of the components
	// upstream mode starts; controlDone is closed when the control loop
	// ended, stopControl ends it.
	errs        chan error
	controlDone chan struct{}
	stopControl context.CancelFunc
}

// StandInControllers are kube-controller-manager's --controllers beside
// the kubelet stand-in: the PV binder alone binds claims (pre-bound or
// matched, as in a cluster). The rest stays off: the node lifecycle
// controller would evict the stand-in's nodes, which renew no Lease.
var StandInControllers = []string{"persistentvolume-binder-controller"}

// NodeName is the name of simulated node i (1-based).
func NodeName(i int) string { return fmt.Sprintf("node-%d", i) }

// NodeID is the CSI node ID the mock driver reports for node i.
func NodeID(i int) string { return stack.NodeID(NodeName(i)) }

// Start brings everything up and returns once the controllers run. The
// stack (internal/stack) runs csi-attacher and the attach/detach
// controller with their binaries' defaults, except where latch-local wants
// a livelier demo: see attacherConfig and controllerConfig.
func Start(ctx context.Context, opts Options) (_ *Env, err error) {
	logger := klog.FromContext(ctx)
	if opts.Nodes <= 0 {
		opts.Nodes = 2
	}
	if opts.Driver == "" {
		opts.Driver = "mock.csi.latch.dev"
	}
	if err := checkMetricsAddresses(opts); err != nil {
		return nil, err
	}
	if opts.Upstream && !opts.RealNodes {
		return nil, errors.New("upstream mode needs real nodes: kube-controller-manager's attach/detach controller waits for the kubelet's volumesInUse, which the kubelet stand-in reports only for latch's controller (drop --real-nodes=false)")
	}
	e := &Env{Opts: opts, errs: make(chan error, 8)}
	defer func() {
		if err != nil {
			e.Stop()
		}
	}()
	start := time.Now()
	cluster, err := localcluster.Start(ctx, localcluster.Options{DataDir: opts.DataDir, KeepData: opts.DataDir != "", EtcdLogOutput: opts.EtcdLogOutput})
	if err != nil {
		return nil, err
	}
	e.Cluster, e.Client = cluster, cluster.Client()
	logger.V(1).Info("Control plane ready", "took", time.Since(start).Round(time.Millisecond), "address", e.Cluster.Host())
	if opts.Kubeconfig != "" {
		if err := e.Cluster.WriteKubeconfig(opts.Kubeconfig); err != nil {
			return nil, err
		}
	}
	if _, err := e.Client.StorageV1().CSIDrivers().Create(ctx, localcluster.NewCSIDriver(opts.Driver, nil), metavCreate()); err != nil && !isAlreadyExists(err) {
		return nil, fmt.Errorf("create CSIDriver %s: %w", opts.Driver, err)
	}
	nodes := make([]localcluster.NodeConfig, opts.Nodes)
	for i := range nodes {
		nodes[i] = localcluster.NodeConfig{Name: NodeName(i + 1)}
	}
	so := stack.Options{
		Cluster:          cluster,
		Driver:           opts.Driver,
		Nodes:            nodes,
		Mock:             mockConfig(opts),
		AttacherConfig:   attacherConfig,
		NoController:     opts.NoAttachDetachController,
		ControllerConfig: controllerConfig,
	}
	serveMetrics(opts, &so)
	so.ControllerManager, so.ControlPlaneOutput = true, opts.ProcessOutput
	if opts.RealNodes {
		so.Nodes, so.NoKubelet = nil, true
		so.Scheduler = true
	} else {
		so.ControllerManagerControllers = StandInControllers
	}
	if opts.Upstream {
		so.Attacher, so.NoController = stack.AttacherOnDemand, true
		so.ControllerManagerControllers = UpstreamControllers
	}
	e.stack, err = stack.Start(ctx, so)
	if err != nil {
		return nil, err
	}
	go func() {
		for err := range e.stack.Err() {
			e.report(err)
		}
	}()
	if opts.RealNodes {
		logger.V(1).Info("Scheduler and controller manager ready", "took", time.Since(start).Round(time.Millisecond))
		if err := e.startHollowNodes(ctx); err != nil {
			return nil, err
		}
		logger.V(1).Info("Hollow nodes Ready", "nodes", opts.Nodes, "took", time.Since(start).Round(time.Millisecond))
	}
	e.Kubelet, e.Driver, e.Socket = e.stack.Kubelet, e.stack.Driver, e.stack.Socket
	if opts.Upstream {
		if err := e.startUpstream(ctx); err != nil {
			return nil, err
		}
		cctx, cancel := context.WithCancel(ctx)
		e.stopControl = cancel
		if err := e.serveControl(cctx); err != nil {
			return nil, err
		}
		logger.V(1).Info("Upstream components running", "took", time.Since(start).Round(time.Millisecond))
	}
	return e, nil
}

// attacherConfig is csi-attacher's configuration in latch-local: the
// binary's defaults, with failed attaches retried sooner (500 ms doubling
// to 30 s) so that --publish-failures shows the retry path quickly, a
// shorter wait for the driver (it is in the same process) and ext4 as the
// default filesystem.
func attacherConfig(_ int, c *attacher.SidecarConfig) {
	// As the binary without --leader-election: hold the driver's Lease
	// while working, so that latchctl (and a second attacher) sees that
	// one runs.
	c.Leader.Presence = &app.Presence{Component: "csi-attacher"}
	if c.Leader.Namespace == "" {
		c.Leader.Namespace = "default"
	}
	c.ConnectTimeout = 30 * time.Second
	c.DefaultFSType = "ext4"
	c.Controller.RetryIntervalStart = 500 * time.Millisecond
	c.Controller.RetryIntervalMax = 30 * time.Second
}

// mockConfig adjusts the mock driver's configuration to opts.
func mockConfig(opts Options) func(*csimock.Config) {
	return func(c *csimock.Config) {
		c.Faults = faultRules(opts)
		c.Backend = opts.Backend
	}
}

func faultRules(opts Options) []csimock.Rule {
	var rules []csimock.Rule
	if opts.PublishLatency > 0 {
		rules = append(rules, csimock.Rule{ID: "publish-latency", Method: "ControllerPublishVolume", Latency: opts.PublishLatency})
	}
	if opts.UnpublishLatency > 0 {
		rules = append(rules, csimock.Rule{ID: "unpublish-latency", Method: "ControllerUnpublishVolume", Latency: opts.UnpublishLatency})
	}
	if opts.PublishFailures > 0 {
		rules = append(rules, csimock.Rule{ID: "publish-failures", Method: "ControllerPublishVolume", Times: opts.PublishFailures,
			Code: codes.Unavailable, Message: "injected by latch-local --publish-failures"})
	}
	return rules
}

// Err delivers the first error of a component that stopped on its own.
func (e *Env) Err() <-chan error { return e.errs }

// report passes a component's error on to Err (dropped when nobody reads).
func (e *Env) report(err error) {
	select {
	case e.errs <- err:
	default:
	}
}

// watch reports c through Err when it ends on its own (a clean stop ends
// with a cancellation).
func (e *Env) watch(c *stack.Component) {
	go func() {
		<-c.Exited()
		if err := c.Result(); err != nil && !errors.Is(err, context.Canceled) {
			e.report(fmt.Errorf("%s: %w", c.Name(), err))
		}
	}()
}

// Stop stops everything and removes temporary files.
func (e *Env) Stop() {
	if e.stopControl != nil {
		e.stopControl()
	}
	if e.controlDone != nil {
		<-e.controlDone
	}
	e.mu.Lock()
	if err := e.stopUpstream(); err != nil {
		klog.Background().Error(err, "Stopping the upstream components")
	}
	e.mu.Unlock()
	if err := e.stopHollowNodes(); err != nil {
		klog.Background().Error(err, "Stopping the hollow nodes")
	}
	if e.stack != nil {
		_ = e.stack.Stop()
	}
	if e.Cluster != nil {
		e.Cluster.Stop()
	}
}
