package stack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/latchcsi/latch/internal/attachdetach/controller"
	"github.com/latchcsi/latch/internal/attacher"
	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/localcluster"
	"github.com/latchcsi/latch/internal/testsupport"
)

// AttacherMode says how Start runs csi-attacher.
type AttacherMode int

const (
	// AttacherInProcess runs Replicas RunSidecar goroutines against the
	// mock driver (leader election on when more than one).
	AttacherInProcess AttacherMode = iota
	// AttacherTrivial runs the attacher's controller in trivial mode: no
	// mock driver is needed, every VolumeAttachment is marked attached.
	AttacherTrivial
	// AttacherNone starts no attacher (the caller runs its own).
	AttacherNone
	// AttacherBinary runs Replicas child processes of the real
	// csi-attacher (built once per process by testsupport.Binary) with
	// their flag defaults and AttacherArgs, against the mock driver.
	AttacherBinary
	// AttacherOnDemand runs the mock driver but starts no attacher: the
	// caller starts replicas when it wants them (StartAttacher,
	// RunAttacher, or the binary against Socket and Kubeconfig).
	AttacherOnDemand
)

// Options shape a stack. The zero value is a fresh control plane, one
// node, a mock driver, one in-process csi-attacher and the attach/detach
// controller, all with their binaries' defaults.
type Options struct {
	// Cluster is a running control plane to use (tests share one per
	// process); nil starts one with ClusterOptions, stopped by Stop.
	Cluster        *localcluster.Cluster
	ClusterOptions localcluster.Options
	// Driver is the CSI driver's name (default mock.csi.latch.dev).
	Driver string
	// Nodes are added to the kubelet stand-in, each with a CSINode entry
	// for Driver (node ID NodeID(name)) unless its Drivers says otherwise.
	Nodes []localcluster.NodeConfig
	// KubeletWorkers is the kubelet stand-in's workers (default 2).
	KubeletWorkers int
	// NoKubelet leaves the kubelet stand-in out.
	NoKubelet bool
	// Mock adjusts the mock driver's configuration.
	Mock func(*csimock.Config)
	// Attacher says how csi-attacher runs; Replicas how many in-process
	// replicas (default 1).
	Attacher AttacherMode
	Replicas int
	// AttacherConfig adjusts each replica's configuration (replica is
	// 0-based); the default is AttacherConfig's.
	AttacherConfig func(replica int, cfg *attacher.SidecarConfig)
	// RestartAttachers runs every in-process replica under a supervisor
	// that restarts RunSidecar when it returns (lost driver connection,
	// lost Lease), as Kubernetes restarts the container
	// (Component.Restarts counts).
	RestartAttachers bool
	// AttacherArgs are extra flags of AttacherBinary replicas;
	// AttacherOutput receives their output (nil: discarded).
	AttacherArgs   []string
	AttacherOutput io.Writer
	// NoController leaves the attach/detach controller out (the caller
	// may start it later with StartController); ControllerConfig adjusts
	// its configuration (default: ControllerConfig's) on every start.
	NoController     bool
	ControllerConfig func(*controller.ServeConfig)
	// Scheduler runs the real kube-scheduler, ControllerManager the real
	// kube-controller-manager with every controller but attachdetach
	// (controlplane.go), or the ones ControllerManagerControllers names
	// (its --controllers); ControlPlaneOutput receives their logs (nil:
	// discarded), SchedulerArgs and ControllerManagerArgs are extra flags.
	Scheduler                    bool
	ControllerManager            bool
	ControllerManagerControllers []string
	ControlPlaneOutput           io.Writer
	SchedulerArgs                []string
	ControllerManagerArgs        []string
}

// Stack is a running world.
type Stack struct {
	Cluster *localcluster.Cluster
	Client  kubernetes.Interface
	Kubelet *localcluster.Kubelet
	Driver  *csimock.Driver // nil without a mock driver
	// DriverName is the CSI driver's name; Socket the mock driver's.
	DriverName string
	Socket     string

	Attachers  []*Component
	Controller *Component
	// Scheduler and ControllerManager run when Options ask for them.
	Scheduler         *Upstream
	ControllerManager *Upstream

	opts       Options
	ownCluster bool
	kubelet    *Component
	tmp        string
	cpDir      string
	errs       chan error
	stopOnce   sync.Once

	// mu guards Attachers and Controller once Start returned.
	mu sync.Mutex
	// controllers are every controller StartController started.
	controllers []*Component
}

// NodeID is the CSI node ID Start gives node name.
func NodeID(name string) string { return "mock-" + name }

// Start brings the stack up; on error, what started is stopped.
func Start(ctx context.Context, o Options) (_ *Stack, err error) {
	if o.Driver == "" {
		o.Driver = "mock.csi.latch.dev"
	}
	if o.Replicas <= 0 {
		o.Replicas = 1
	}
	if o.KubeletWorkers <= 0 {
		o.KubeletWorkers = 2
	}
	s := &Stack{opts: o, DriverName: o.Driver, Cluster: o.Cluster, errs: make(chan error, 8)}
	defer func() {
		if err != nil {
			_ = s.Stop()
		}
	}()
	if s.Cluster == nil {
		if s.Cluster, err = localcluster.Start(ctx, o.ClusterOptions); err != nil {
			return nil, err
		}
		s.ownCluster = true
	}
	s.Client = s.Cluster.Client()
	if err := s.startControlPlane(ctx); err != nil {
		return nil, err
	}

	if o.Attacher == AttacherInProcess || o.Attacher == AttacherBinary || o.Attacher == AttacherOnDemand {
		// Unix socket paths are limited to ~100 bytes: keep it short.
		if s.tmp, err = os.MkdirTemp("", "latch-stack"); err != nil {
			return nil, err
		}
		s.Socket = filepath.Join(s.tmp, "csi.sock")
		if s.Driver, err = MockDriver(ctx, o.Driver, s.Socket, o.Mock); err != nil {
			return nil, err
		}
	}
	if !o.NoKubelet {
		s.Kubelet = localcluster.NewKubelet(s.Client)
		k := s.Kubelet
		s.kubelet = Go(ctx, "kubelet", func(ctx context.Context) error { k.Run(ctx, o.KubeletWorkers); return nil })
		for _, n := range o.Nodes {
			if n.Drivers == nil && !n.NoCSINode {
				n.Drivers = map[string]string{o.Driver: NodeID(n.Name)}
			}
			if err := s.Kubelet.AddNode(ctx, n); err != nil {
				return nil, fmt.Errorf("add node %s: %w", n.Name, err)
			}
		}
	}
	switch o.Attacher {
	case AttacherInProcess:
		for i := range o.Replicas {
			if _, err := s.StartAttacher(ctx, i, s.Cluster.RESTConfig()); err != nil {
				return nil, err
			}
		}
	case AttacherBinary:
		if err := s.startBinaryAttachers(ctx); err != nil {
			return nil, err
		}
	case AttacherTrivial:
		a, err := TrivialAttacher(ctx, "csi-attacher", s.Client, o.Driver)
		if err != nil {
			return nil, err
		}
		s.track(a)
	}
	if !o.NoController {
		s.StartController(ctx)
	}
	return s, nil
}

// StartController starts an attach/detach controller with
// ControllerConfig adjusted by Options.ControllerConfig (called again on
// every start), then by adjust (this start only: its own API transport,
// say): after Start (with NoController), or again after the previous one
// stopped or was killed. It becomes s.Controller; Stop stops every
// controller started.
func (s *Stack) StartController(ctx context.Context, adjust ...func(*controller.ServeConfig)) *Component {
	cfg := ControllerConfig(s.Cluster.RESTConfig())
	if s.opts.ControllerConfig != nil {
		s.opts.ControllerConfig(&cfg)
	}
	for _, f := range adjust {
		f(&cfg)
	}
	c := Controller(ctx, "attachdetach-controller", cfg)
	s.watch(c)
	s.mu.Lock()
	s.Controller = c
	s.controllers = append(s.controllers, c)
	s.mu.Unlock()
	return c
}

// StopKubelet stops the kubelet stand-in (its nodes stay, no longer
// updated: a node whose kubelet died).
func (s *Stack) StopKubelet() error {
	if s.kubelet == nil {
		return nil
	}
	return s.kubelet.Stop()
}

// StartAttacher starts one more in-process csi-attacher replica (replica
// numbers its configuration) talking to the API server through cfg.
func (s *Stack) StartAttacher(ctx context.Context, replica int, cfg *rest.Config) (*Component, error) {
	if s.Socket == "" {
		return nil, errors.New("no mock driver to attach with: the stack runs no in-process attacher")
	}
	c := AttacherConfig(cfg, s.Socket)
	if s.opts.Replicas > 1 {
		c.Leader.Enabled = true
		c.Leader.Namespace = "default"
		c.Leader.Identity = "csi-attacher-" + strconv.Itoa(replica)
	}
	if s.opts.AttacherConfig != nil {
		s.opts.AttacherConfig(replica, &c)
	}
	return s.RunAttacher(ctx, "csi-attacher", c), nil
}

// RunAttacher runs csi-attacher with cfg as a component named name (its
// logger's name), under a supervisor when Options.RestartAttachers, and
// stops it at Stop. cfg usually starts as AttacherConfig(rest, s.Socket).
func (s *Stack) RunAttacher(ctx context.Context, name string, cfg attacher.SidecarConfig) *Component {
	var a *Component
	if s.opts.RestartAttachers {
		a = RestartingAttacher(ctx, name, cfg)
	} else {
		a = Attacher(ctx, name, cfg)
	}
	s.track(a)
	return a
}

// track watches an attacher and stops it at Stop.
func (s *Stack) track(a *Component) {
	s.watch(a)
	s.mu.Lock()
	s.Attachers = append(s.Attachers, a)
	s.mu.Unlock()
}

// watch reports a component that ends on its own through Err.
func (s *Stack) watch(c *Component) {
	go func() {
		<-c.exited
		if err := c.result; err != nil && !errors.Is(err, context.Canceled) && !c.killed.Load() {
			select {
			case s.errs <- fmt.Errorf("%s: %w", c.name, err):
			default:
			}
		}
	}()
}

// Err delivers the errors of components that stopped on their own.
func (s *Stack) Err() <-chan error { return s.errs }

// Stop stops every component (controller, attachers, kubelet, driver,
// then the control plane if Start started it) and removes temporary files.
// It returns the components' errors.
func (s *Stack) Stop() error {
	var errs []error
	s.stopOnce.Do(func() {
		s.mu.Lock()
		controllers, attachers := s.controllers, s.Attachers
		s.mu.Unlock()
		for _, c := range controllers {
			errs = append(errs, c.Stop())
		}
		for _, a := range attachers {
			errs = append(errs, a.Stop())
		}
		if s.kubelet != nil {
			errs = append(errs, s.kubelet.Stop())
		}
		errs = append(errs, s.stopControlPlane()...)
		if s.Driver != nil {
			s.Driver.Stop()
		}
		if s.ownCluster && s.Cluster != nil {
			s.Cluster.Stop()
		}
		if s.tmp != "" {
			os.RemoveAll(s.tmp)
		}
	})
	return errors.Join(errs...)
}

// startBinaryAttachers runs the csi-attacher binary, Replicas times.
func (s *Stack) startBinaryAttachers(ctx context.Context) error {
	bin, err := testsupport.Binary("cmd/csi-attacher")
	if err != nil {
		return err
	}
	kubeconfig := filepath.Join(s.tmp, "kubeconfig")
	if err := s.Cluster.WriteKubeconfig(kubeconfig); err != nil {
		return err
	}
	for i := range s.opts.Replicas {
		args := []string{"--csi-address=" + s.Socket, "--kubeconfig=" + kubeconfig}
		if s.opts.Replicas > 1 {
			args = append(args, "--leader-election", "--leader-election-namespace=default")
		}
		a, err := Process(ctx, "csi-attacher-"+strconv.Itoa(i), s.opts.AttacherOutput, bin, append(args, s.opts.AttacherArgs...)...)
		if err != nil {
			return err
		}
		s.track(a)
	}
	return nil
}

// RunTestMain is a test package's TestMain body for suites on one shared
// control plane: localcluster.RunTestMain (one cluster for the package,
// in *shared), then the binaries testsupport.Binary built are removed and
// the process exits with the tests' code.
//
//	var cluster *localcluster.Cluster
//	func TestMain(m *testing.M) { stack.RunTestMain(m, &cluster) }
func RunTestMain(m *testing.M, shared **localcluster.Cluster) {
	code := localcluster.RunTestMain(m, shared)
	testsupport.RemoveBinaries()
	os.Exit(code)
}
