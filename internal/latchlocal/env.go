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
	"os"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/attacher"
	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/localcluster"
)

// Options configure Start.
type Options struct {
	Nodes  int    // simulated nodes, named node-1 … node-N
	Driver string // CSI driver name
	// PublishLatency / UnpublishLatency delay the mock driver's calls.
	PublishLatency   time.Duration
	UnpublishLatency time.Duration
	// PublishFailures makes the first N ControllerPublish calls fail with
	// Unavailable, to watch the retry path.
	PublishFailures int64
	// Kubeconfig is where to write the admin kubeconfig ("" = don't).
	Kubeconfig string
	// DataDir keeps the cluster's data ("" = temporary).
	DataDir string
	// NoAttachDetachController leaves the attach/detach controller out.
	NoAttachDetachController bool
	// EtcdLogOutput: see localcluster.Options.
	EtcdLogOutput string
}

// Env is a running local system.
type Env struct {
	Cluster *localcluster.Cluster
	Client  kubernetes.Interface
	Kubelet *localcluster.Kubelet
	Driver  *csimock.Driver
	Opts    Options
	Socket  string

	cancel context.CancelFunc
	wg     sync.WaitGroup
	errs   chan error
	tmp    string
}

// NodeName is the name of simulated node i (1-based).
func NodeName(i int) string { return fmt.Sprintf("node-%d", i) }

// NodeID is the CSI node ID the mock driver reports for node i.
func NodeID(i int) string { return fmt.Sprintf("mock-node-%d", i) }

// Start brings everything up and returns once the controllers run.
func Start(ctx context.Context, opts Options) (_ *Env, err error) {
	logger := klog.FromContext(ctx)
	if opts.Nodes <= 0 {
		opts.Nodes = 2
	}
	if opts.Driver == "" {
		opts.Driver = "mock.csi.latch.dev"
	}
	e := &Env{Opts: opts, errs: make(chan error, 4)}
	defer func() {
		if err != nil {
			e.Stop()
		}
	}()
	runCtx, cancel := context.WithCancel(ctx)
	e.cancel = cancel

	start := time.Now()
	e.Cluster, err = localcluster.Start(ctx, localcluster.Options{DataDir: opts.DataDir, KeepData: opts.DataDir != "", EtcdLogOutput: opts.EtcdLogOutput})
	if err != nil {
		return nil, err
	}
	logger.V(1).Info("Control plane ready", "took", time.Since(start).Round(time.Millisecond), "address", e.Cluster.Host())
	e.Client = e.Cluster.Client()
	if opts.Kubeconfig != "" {
		if err := e.Cluster.WriteKubeconfig(opts.Kubeconfig); err != nil {
			return nil, err
		}
	}

	// The mock driver, on a short socket path (unix sockets are limited
	// to ~100 bytes).
	if e.tmp, err = os.MkdirTemp("", "latch-local"); err != nil {
		return nil, err
	}
	e.Socket = filepath.Join(e.tmp, "csi.sock")
	cfg := csimock.DefaultConfig()
	cfg.Name = opts.Driver
	cfg.NodeService = false
	cfg.AutoCreateVolumes = true
	cfg.Faults = faultRules(opts)
	if e.Driver, err = csimock.New(cfg); err != nil {
		return nil, err
	}
	if err := e.Driver.Start(ctx, e.Socket); err != nil {
		return nil, err
	}

	// Pre-bound claims applied by hand get bound (no PV controller here).
	e.goRun(func() error { e.runBinder(runCtx); return nil })

	// Simulated nodes.
	e.Kubelet = localcluster.NewKubelet(e.Client)
	e.goRun(func() error { e.Kubelet.Run(runCtx, 2); return nil })
	for i := 1; i <= opts.Nodes; i++ {
		if err := e.Kubelet.AddNode(ctx, localcluster.NodeConfig{Name: NodeName(i), Drivers: map[string]string{opts.Driver: NodeID(i)}}); err != nil {
			return nil, err
		}
	}
	if _, err := e.Client.StorageV1().CSIDrivers().Create(ctx, localcluster.NewCSIDriver(opts.Driver, nil), metavCreate()); err != nil && !isAlreadyExists(err) {
		return nil, fmt.Errorf("create CSIDriver %s: %w", opts.Driver, err)
	}

	// csi-attacher, through the same entry point as the binary.
	e.goRun(func() error {
		return attacher.RunSidecar(klog.NewContext(runCtx, logger.WithName("csi-attacher")), attacher.SidecarConfig{
			RESTConfig: e.Cluster.RESTConfig(), CSIAddress: e.Socket,
			ConnectTimeout: 30 * time.Second, Resync: 10 * time.Minute, DefaultFSType: "ext4",
			Controller: attacher.Config{
				Workers: attacher.DefaultWorkers, Timeout: 15 * time.Second,
				RetryIntervalStart: 500 * time.Millisecond, RetryIntervalMax: 30 * time.Second,
				ReconcileSync: time.Minute,
			},
		})
	})
	if !opts.NoAttachDetachController {
		if err := e.startAttachDetach(runCtx); err != nil {
			return nil, err
		}
	}
	return e, nil
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

func (e *Env) goRun(f func() error) {
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		if err := f(); err != nil && !errors.Is(err, context.Canceled) {
			select {
			case e.errs <- err:
			default:
			}
		}
	}()
}

// Err delivers the first error of a component that stopped on its own.
func (e *Env) Err() <-chan error { return e.errs }

// Stop stops everything and removes temporary files.
func (e *Env) Stop() {
	if e.cancel != nil {
		e.cancel()
	}
	e.wg.Wait()
	if e.Driver != nil {
		e.Driver.Stop()
	}
	if e.Cluster != nil {
		e.Cluster.Stop()
	}
	if e.tmp != "" {
		os.RemoveAll(e.tmp)
	}
}
