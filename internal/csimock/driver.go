package csimock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// Driver is the mock CSI driver. It is safe for concurrent use. Create it
// with New, serve it with Start or Serve, inspect it with Calls, Stats,
// State and Published, and break it with AddFault and Crash.
type Driver struct {
	cfg    Config
	clock  clock.WithTicker
	born   time.Time
	state  *store
	faults *faultSet
	calls  *callLog
	// nodes holds every node's node-service state; endpoints the node
	// sockets StartNode serves (see nodeendpoint.go).
	nodes nodeSet
	// extraPublishContext is added to every ControllerPublishVolume
	// response (SetExtraPublishContext).
	extraPublishContext atomic.Pointer[map[string]string]
	// backend is the storage backend model of the controller calls
	// (backend.go); nil answers at once.
	backend atomic.Pointer[backendModel]
	// endlessTokens numbers the tokens of NextTokenFresh faults.
	endlessTokens atomic.Uint64

	// ready is readyUnset, readyTrue or readyFalse (SetReady overrides the
	// configured not-ready period).
	ready atomic.Int32

	// mu guards the serving lifecycle below.
	mu         sync.Mutex
	logger     klog.Logger
	socketPath string
	server     *grpc.Server
	serveDone  chan struct{}
	// down is closed when the current instance crashes or stops, releasing
	// hung calls of that instance. Replaced on every (re)start.
	down chan struct{}
}

const (
	readyUnset int32 = iota
	readyTrue
	readyFalse
)

// New validates cfg and returns a driver that is not serving yet.
func New(cfg Config) (*Driver, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("invalid csimock config: %w", err)
	}
	clk := cfg.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	d := &Driver{
		cfg:    cfg,
		clock:  clk,
		born:   clk.Now(),
		state:  newStore(&cfg),
		faults: &faultSet{seed: cfg.Seed},
		calls:  newCallLog(cfg.CallLogSize),
		nodes:  nodeSet{states: map[string]*nodeState{}, endpoints: map[string]*NodeEndpoint{}},
		logger: klog.Background(),
		down:   make(chan struct{}),
	}
	for _, r := range cfg.Faults {
		if _, err := d.faults.add(r); err != nil {
			return nil, fmt.Errorf("invalid csimock config: %w", err)
		}
	}
	if err := d.SetBackend(cfg.Backend); err != nil {
		return nil, fmt.Errorf("invalid csimock config: %w", err)
	}
	return d, nil
}

// Config returns the configuration the driver was built with.
func (d *Driver) Config() Config { return d.cfg }

// Endpoint returns the unix socket path the driver serves (or served) on.
func (d *Driver) Endpoint() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.socketPath
}

// Start listens on socketPath (a path, or "unix://path") and serves in the
// background until Stop or Crash. A stale socket file is replaced. The
// logger of ctx is used for the driver's logs; ctx is not retained.
func (d *Driver) Start(ctx context.Context, socketPath string) error {
	path := strings.TrimPrefix(socketPath, "unix://")
	if path == "" {
		return errors.New("csimock: empty socket path")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.server != nil {
		return fmt.Errorf("csimock: already serving on %s", d.socketPath)
	}
	d.logger = klog.FromContext(ctx)
	d.socketPath = path
	return d.listenLocked()
}

// listenLocked starts a fresh gRPC server on d.socketPath.
func (d *Driver) listenLocked() error {
	lis, err := listenUnix(d.socketPath)
	if err != nil {
		return err
	}
	// Calls of this instance carry its epoch, so after Crash bumps the
	// store's epoch none of them, not even one accepted during shutdown,
	// can commit. They also carry its down channel, which releases hangs.
	d.down = make(chan struct{})
	inst := instance{epoch: d.state.currentEpoch(), down: d.down, logger: d.logger, nodeID: d.cfg.NodeID}
	srv := grpc.NewServer(grpc.UnaryInterceptor(d.interceptor(inst)))
	csi.RegisterIdentityServer(srv, &identityServer{d: d})
	csi.RegisterControllerServer(srv, &controllerServer{d: d})
	if d.cfg.NodeService {
		csi.RegisterNodeServer(srv, &nodeServer{d: d, node: d.nodes.state(d.cfg.NodeID)})
	}
	d.server = srv
	d.serveDone = serveGRPC(srv, lis, d.logger, "CSI mock driver")
	d.logger.V(2).Info("CSI mock driver serving", "endpoint", d.socketPath, "driver", d.cfg.Name)
	return nil
}

// listenUnix listens on a unix socket at path, creating its directory and
// replacing a stale socket file.
func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("csimock: create socket directory: %w", err)
	}
	if err := removeStaleSocket(path); err != nil {
		return nil, err
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("csimock: listen on %s: %w", path, err)
	}
	return lis, nil
}

// serveGRPC serves srv on lis in the background; the returned channel is
// closed when Serve returned.
func serveGRPC(srv *grpc.Server, lis net.Listener, logger klog.Logger, what string) chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Serve returns nil after Stop; anything else is worth a log line
		// but not a panic: the test or binary notices the dead socket.
		if err := srv.Serve(lis); err != nil {
			logger.Error(err, what+" stopped serving", "endpoint", lis.Addr().String())
		}
	}()
	return done
}

// removeStaleSocket removes a leftover socket file (from a crash), but
// refuses to delete anything that is not a socket.
func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("csimock: inspect %s: %w", path, err)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("csimock: %s exists and is not a socket", path)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("csimock: remove stale socket: %w", err)
	}
	return nil
}

// stopLocked stops the gRPC server: listener and connections close, running
// calls see their context cancelled. It waits for Serve to return.
func (d *Driver) stopLocked() bool {
	srv, done := d.server, d.serveDone
	if srv == nil {
		return false
	}
	d.server = nil
	close(d.down)
	srv.Stop()
	<-done
	return true
}

// Stop stops serving and removes the socket. It is idempotent.
func (d *Driver) Stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stopLocked()
	if d.socketPath != "" {
		if err := os.Remove(d.socketPath); err != nil && !errors.Is(err, os.ErrNotExist) {
			d.logger.Error(err, "Cannot remove CSI mock driver socket", "endpoint", d.socketPath)
		}
	}
}

// Serve is Start followed by Stop when ctx is done.
func (d *Driver) Serve(ctx context.Context, socketPath string) error {
	if err := d.Start(ctx, socketPath); err != nil {
		return err
	}
	<-ctx.Done()
	d.Stop()
	return nil
}

// Crash simulates the driver process dying: the listener and every
// connection close at once, in-flight calls fail, and no handler of the
// crashed instance changes state afterwards. The socket file stays behind,
// as a killed process leaves it. With keepState, everything the backend
// recorded survives ("forget nothing"); without it, publications made by
// calls that had not returned to their caller yet are rolled back. Restart
// serves again on the same path.
func (d *Driver) Crash(keepState bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.server == nil {
		return errors.New("csimock: not serving")
	}
	// Fence first, so nothing of the old instance commits while the server
	// shuts down.
	rolledBack := d.state.crash(keepState)
	d.stopLocked()
	d.logger.V(2).Info("CSI mock driver crashed", "keepState", keepState, "rolledBackPublishes", rolledBack)
	return nil
}

// Restart serves again on the socket path of the last Start, after Crash
// or Stop.
func (d *Driver) Restart() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.server != nil {
		return errors.New("csimock: still serving")
	}
	if d.socketPath == "" {
		return errors.New("csimock: never started")
	}
	return d.listenLocked()
}

// Serving reports whether the driver accepts connections.
func (d *Driver) Serving() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.server != nil
}

// SetReady overrides Probe's readiness (and the configured not-ready
// period) from now on.
func (d *Driver) SetReady(ready bool) {
	if ready {
		d.ready.Store(readyTrue)
	} else {
		d.ready.Store(readyFalse)
	}
}

// Ready is what Probe reports now.
func (d *Driver) Ready() bool {
	switch d.ready.Load() {
	case readyTrue:
		return true
	case readyFalse:
		return false
	}
	return d.clock.Since(d.born) >= d.cfg.ProbeNotReadyFor
}
