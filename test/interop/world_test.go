package interop

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/localcluster"
	"github.com/latchcsi/latch/internal/stack"
	"github.com/latchcsi/latch/internal/testsupport"
)

// The worlds here use GCE PD's CSI driver name, so that an inline in-tree
// GCE PD volume is migrated to the mock driver by both kube-controller-
// manager and latch (csi-translation-lib maps kubernetes.io/gce-pd to it).
const driver = "pd.csi.storage.gke.io"

// adKind says which attach/detach controller a world runs.
type adKind string

// atKind says which CSI attacher sidecar a world runs.
type atKind string

const (
	kcmAD   adKind = "kcm"
	latchAD adKind = "latch-ad"
	upAt    atKind = "upstream-attacher"
	latchAt atKind = "latch-attacher"
)

// pair is one cell column of the matrix.
type pair struct {
	ad adKind
	at atKind
}

func (p pair) String() string { return string(p.ad) + "+" + string(p.at) }

var pairs = []pair{{kcmAD, upAt}, {kcmAD, latchAt}, {latchAD, upAt}, {latchAD, latchAt}}

// maxWaitForUnmount is latch's --max-wait-for-unmount in the worlds (kcm's
// is fixed at 6 minutes).
const maxWaitForUnmount = 3 * time.Second

// peer is one running controller process of a world.
type peer struct {
	name string
	args []string
	comp *stack.Component
	// up is set for an upstream process.
	up         *stack.Upstream
	metricsURL string
}

// Scrape reads the peer's /metrics.
func (p *peer) Scrape(ctx context.Context) (testsupport.Samples, error) {
	if p.up != nil {
		return p.up.Scrape(ctx)
	}
	return testsupport.Scrape(ctx, p.metricsURL)
}

// world is one control plane with nodes (kubelet stand-in), the mock
// driver, and one attacher and one attach/detach controller of the pair.
type world struct {
	t      *testing.T
	ctx    context.Context
	pair   pair
	s      *stack.Stack
	drv    *csimock.Driver
	socket string
	kcfg   string
	out    *os.File

	mu       sync.Mutex
	attacher *peer
	ctrl     *peer
	// kcm is kube-controller-manager with its other controllers, in a
	// world of hollow nodes (newHollowWorld); ctrl is then latch's
	// attach/detach controller while kcm runs without its own.
	kcm *peer
	// kcmDir holds kcm's files (newHollowWorld).
	kcmDir string
	// stopNodes stops the hollow nodes (nil: none).
	stopNodes func()
	// kubelets stand in for the nodes that can go down
	// (addDownableNode, downNode): name → stop.
	kubelets map[string]context.CancelFunc
	downable map[string]*localcluster.Kubelet
	seq      int
	// volumeAt is when the last volume was created (kcmPVGrace).
	volumeAt time.Time
}

// worldNodes are the nodes every world starts with; downableNodes too,
// each with a kubelet stand-in of its own so that a scenario can take it
// down. All exist before the controllers start: kcm drops a Pod it sees
// before its node and only finds it again at its next full Pod list (up
// to 3 minutes later), where real kubelets register long before Pods land.
var (
	worldNodes    = []string{"node-a", "node-b"}
	downableNodes = []string{"node-notready", "node-oos"}
)

// newWorld starts a control plane of its own with the pair's peers.
func newWorld(t *testing.T, ctx context.Context, p pair) *world {
	t.Helper()
	var nodes []localcluster.NodeConfig
	for _, n := range worldNodes {
		nodes = append(nodes, localcluster.NodeConfig{Name: n})
	}
	w := startWorld(t, ctx, p, stack.Options{Driver: driver, Attacher: stack.AttacherNone, NoController: true, Nodes: nodes})
	var err error
	if w.drv, err = stack.MockDriver(ctx, driver, w.socket, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.drv.Stop)
	for _, n := range downableNodes {
		w.addDownableNode(n)
	}
	w.attacher = w.startAttacher(p.at, nil)
	w.ctrl = w.startController(p.ad, controllerOptions{})
	return w
}

// startWorld starts the stack of o and what every world has: the
// controllers' output file, a socket path (the stack's mock driver's if
// it runs one) and a kubeconfig; cleanup stops every peer, then the
// stack.
func startWorld(t *testing.T, ctx context.Context, p pair, o stack.Options) *world {
	t.Helper()
	w := &world{t: t, ctx: ctx, pair: p, kubelets: map[string]context.CancelFunc{}, downable: map[string]*localcluster.Kubelet{}}
	s, err := stack.Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	w.s = s
	dir, err := os.MkdirTemp("", "interop") // short: a unix socket path
	if err != nil {
		t.Fatal(err)
	}
	// The controllers' output goes to a file, kept when the test fails.
	if w.out, err = os.CreateTemp("", "interop-"+p.String()+"-*.log"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		w.stopAll()
		if err := s.Stop(); err != nil {
			t.Errorf("stack: %v", err)
		}
		os.RemoveAll(dir)
		w.out.Close()
		if t.Failed() {
			t.Logf("the controllers' output is in %s", w.out.Name())
		} else {
			os.Remove(w.out.Name())
		}
	})
	w.socket, w.kcfg = filepath.Join(dir, "csi.sock"), filepath.Join(dir, "kubeconfig")
	if s.Driver != nil {
		w.drv, w.socket = s.Driver, s.Socket
	}
	if err := s.Cluster.WriteKubeconfig(w.kcfg); err != nil {
		t.Fatal(err)
	}
	return w
}

// attacherConfig gives both attachers the same flags: upstream's deploy
// example (--v=5, --csi-address, --http-endpoint; the kubeconfig for out
// of cluster) with retries fast enough for the suite, plus extra.
func (w *world) attacherConfig(name, endpoint string, extra []string) stack.UpstreamAttacherConfig {
	return stack.UpstreamAttacherConfig{
		Name: name, CSIAddress: w.socket, Kubeconfig: w.kcfg, HTTPEndpoint: endpoint, Timeout: 10 * time.Second,
		Args:   append([]string{"--retry-interval-start=500ms", "--retry-interval-max=2s"}, extra...),
		Output: prefixed(w.out, name),
	}
}

// startAttacher starts an attacher of kind with the shared flags plus extra.
func (w *world) startAttacher(kind atKind, extra []string) *peer {
	w.t.Helper()
	w.seq++
	name := fmt.Sprintf("%s-%d", kind, w.seq)
	endpoint := testsupport.FreeAddr(w.t)
	cfg := w.attacherConfig(name, endpoint, extra)
	if kind == upAt {
		u, err := stack.StartUpstreamAttacher(w.ctx, cfg)
		if err != nil {
			w.t.Fatal(err)
		}
		return &peer{name: name, args: u.Args, comp: u.Component, up: u, metricsURL: u.MetricsURL}
	}
	return w.startLatch(name, "cmd/csi-attacher", endpoint, stack.UpstreamAttacherArgs(cfg))
}

// controllerOptions adjust a controller start.
type controllerOptions struct {
	leaderElect bool
	// kcmControllers is kcm's --controllers (default: attachdetach).
	kcmControllers []string
}

// startController starts an attach/detach controller of kind.
func (w *world) startController(kind adKind, o controllerOptions) *peer {
	w.t.Helper()
	w.seq++
	name := fmt.Sprintf("%s-%d", kind, w.seq)
	if kind == kcmAD {
		u, err := stack.StartKubeControllerManager(w.ctx, stack.KubeControllerManagerConfig{
			Name: name, Kubeconfig: w.kcfg, LeaderElect: o.leaderElect, Controllers: o.kcmControllers, Output: prefixed(w.out, name),
		})
		if err != nil {
			w.t.Fatal(err)
		}
		return &peer{name: name, args: u.Args, comp: u.Component, up: u, metricsURL: u.MetricsURL}
	}
	endpoint := testsupport.FreeAddr(w.t)
	args := []string{
		"--kubeconfig=" + w.kcfg, "--v=2", "--http-endpoint=" + endpoint,
		"--leader-elect=" + strconv.FormatBool(o.leaderElect),
		"--max-wait-for-unmount=" + maxWaitForUnmount.String(),
	}
	return w.startLatch(name, "cmd/attachdetach-controller", endpoint, args)
}

// startLatch runs one of latch's binaries and waits for its /metrics. Its
// output goes to the world's log and to also.
func (w *world) startLatch(name, pkg, endpoint string, args []string, also ...io.Writer) *peer {
	w.t.Helper()
	return w.startBinary(name, testsupport.MustBinary(w.t, pkg), endpoint, args, also...)
}

// startBinary runs the binary bin (one of latch's, of this checkout or
// another build) and waits for its /metrics at endpoint.
func (w *world) startBinary(name, bin, endpoint string, args []string, also ...io.Writer) *peer {
	w.t.Helper()
	c, err := stack.Process(w.ctx, name, io.MultiWriter(append([]io.Writer{prefixed(w.out, name)}, also...)...), bin, args...)
	if err != nil {
		w.t.Fatal(err)
	}
	p := &peer{name: name, args: args, comp: c, metricsURL: "http://" + endpoint + "/metrics"}
	err = testsupport.Poll(w.ctx, time.Minute, func(ctx context.Context) (bool, error) {
		select {
		case <-c.Exited():
			return false, fmt.Errorf("%s exited: %v", name, c.Result())
		default:
		}
		_, err := testsupport.Scrape(ctx, p.metricsURL)
		return err == nil, nil
	})
	if err != nil {
		_ = c.Stop()
		w.t.Fatalf("%s (%s %v) did not serve /metrics: %v (output in %s)", name, bin, args, err, w.out.Name())
	}
	return p
}

// stop stops a peer (SIGTERM) and reports its error.
func (w *world) stop(p *peer) {
	w.t.Helper()
	if p == nil {
		return
	}
	if err := p.comp.Stop(); err != nil {
		w.t.Errorf("%s: %v", p.name, err)
	}
}

func (w *world) stopAll() {
	w.mu.Lock()
	kubelets := w.kubelets
	w.kubelets = nil
	w.mu.Unlock()
	for _, stop := range kubelets {
		stop()
	}
	w.stop(w.ctrl)
	w.stop(w.kcm)
	w.stop(w.attacher)
	w.ctrl, w.kcm, w.attacher = nil, nil, nil
	if w.stopNodes != nil {
		w.stopNodes()
		w.stopNodes = nil
	}
}

// addDownableNode adds a node run by a kubelet stand-in of its own, so that
// stopKubelet can take just this node down.
func (w *world) addDownableNode(name string) {
	w.t.Helper()
	k := localcluster.NewKubelet(w.s.Client)
	ctx, cancel := context.WithCancel(w.ctx)
	done := make(chan struct{})
	go func() { defer close(done); k.Run(ctx, 2) }()
	w.mu.Lock()
	w.kubelets[name] = func() { cancel(); <-done }
	w.mu.Unlock()
	if err := k.AddNode(w.ctx, localcluster.NodeConfig{Name: name, Drivers: map[string]string{driver: stack.NodeID(name)}}); err != nil {
		w.t.Fatal(err)
	}
	w.mu.Lock()
	w.downable[name] = k
	w.mu.Unlock()
}

// downNode stops the node's kubelet stand-in (its volumes stay in
// volumesInUse, as on a crashed node) and marks it NotReady.
func (w *world) downNode(name string) {
	w.t.Helper()
	w.mu.Lock()
	stop, k := w.kubelets[name], w.downable[name]
	delete(w.kubelets, name)
	w.mu.Unlock()
	if stop == nil {
		w.t.Fatalf("node %s has no kubelet of its own (addDownableNode)", name)
	}
	stop()
	if err := k.SetReady(w.ctx, name, false); err != nil {
		w.t.Fatal(err)
	}
}
