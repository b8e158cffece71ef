package csimock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// A node endpoint is the driver's node plugin on one node, as a CSI
// driver's DaemonSet Pod would run it: the Identity and Node services on a
// socket of its own, and optionally the kubelet plugin-registration
// service (what node-driver-registrar serves) in that node's kubelet
// plugins_registry directory, so that the kubelet discovers the driver,
// asks NodeGetInfo and writes the CSINode itself. Every endpoint shares
// the driver's volume store (NodeStageVolume requires the volume to be
// ControllerPublished to its node), fault rules (match them to a node
// with Rule.NodeID) and call log (Call.Endpoint says which socket got a
// call).

// NodeConfig says where a node endpoint serves.
type NodeConfig struct {
	// NodeID is what NodeGetInfo reports: the node ID the kubelet writes
	// into the CSINode and the attacher publishes to.
	NodeID string
	// Socket is the node plugin's unix socket (a path or unix://path).
	Socket string
	// RegistrationDir, when set, is the kubelet's plugins_registry
	// directory (<kubelet root>/plugins_registry): the kubelet
	// plugin-registration service serves there on <driver>-reg.sock.
	RegistrationDir string
	// MaxVolumes, when positive, is this node's attach limit instead of
	// Config.MaxVolumesPerNode: NodeGetInfo reports it (the kubelet
	// publishes it as the CSINode's allocatable count) and
	// ControllerPublishVolume to this node ID fails with ResourceExhausted
	// beyond it. It stays in force after Stop, as a node's limit would.
	MaxVolumes int64
}

// RegistrationSupportedVersions are the CSI versions GetInfo announces to
// the kubelet.
var RegistrationSupportedVersions = []string{"1.0.0"}

// RegistrationStatus is what the kubelet told a node endpoint through
// NotifyRegistrationStatus.
type RegistrationStatus struct {
	// InfoCalls counts the kubelet's GetInfo calls.
	InfoCalls int `json:"infoCalls"`
	// Notified is set once the kubelet reported an outcome; Registered
	// and Error are the last one.
	Notified   bool   `json:"notified"`
	Registered bool   `json:"registered"`
	Error      string `json:"error,omitempty"`
}

// NodeEndpoint is a running node endpoint; Stop ends it.
type NodeEndpoint struct {
	d         *Driver
	cfg       NodeConfig
	socket    string
	regSocket string
	logger    klog.Logger

	mu      sync.Mutex
	stopped bool
	servers []*grpc.Server
	done    []chan struct{}
	// sockets are the socket files this endpoint created; Stop removes
	// only these.
	sockets   []string
	down      chan struct{}
	regStatus RegistrationStatus
}

// nodeSet is every node's state (kept across endpoint restarts, as a
// node's mounts survive its plugin's restart) and the running endpoints.
type nodeSet struct {
	mu        sync.Mutex
	states    map[string]*nodeState
	endpoints map[string]*NodeEndpoint
}

// state returns node id's state, creating it on first use.
func (n *nodeSet) state(id string) *nodeState {
	n.mu.Lock()
	defer n.mu.Unlock()
	st := n.states[id]
	if st == nil {
		st = newNodeState(id)
		n.states[id] = st
	}
	return st
}

// StartNode serves a node endpoint for c.NodeID until Stop. A node has at
// most one running endpoint. The logger of ctx is used; ctx is not
// retained.
func (d *Driver) StartNode(ctx context.Context, c NodeConfig) (_ *NodeEndpoint, err error) {
	if c.NodeID == "" {
		return nil, errors.New("csimock: node endpoint needs a node ID")
	}
	if c.MaxVolumes < 0 {
		return nil, fmt.Errorf("csimock: node endpoint for %s: max volumes must not be negative, got %d", c.NodeID, c.MaxVolumes)
	}
	e := &NodeEndpoint{
		d: d, cfg: c, socket: strings.TrimPrefix(c.Socket, "unix://"),
		logger: klog.LoggerWithValues(klog.FromContext(ctx), "node", c.NodeID),
		down:   make(chan struct{}),
	}
	if e.socket == "" {
		return nil, fmt.Errorf("csimock: node endpoint for %s: empty socket path", c.NodeID)
	}
	d.nodes.mu.Lock()
	if _, running := d.nodes.endpoints[c.NodeID]; running {
		d.nodes.mu.Unlock()
		return nil, fmt.Errorf("csimock: node %s already has a running endpoint", c.NodeID)
	}
	d.nodes.endpoints[c.NodeID] = e
	d.nodes.mu.Unlock()
	defer func() {
		if err != nil {
			e.Stop()
		}
	}()

	if c.MaxVolumes > 0 {
		d.state.setNodeLimit(c.NodeID, c.MaxVolumes)
	}
	lis, err := listenUnix(e.socket)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", c.NodeID, err)
	}
	inst := instance{epoch: d.state.currentEpoch(), down: e.down, logger: e.logger, nodeID: c.NodeID, endpoint: c.NodeID}
	srv := grpc.NewServer(grpc.UnaryInterceptor(d.interceptor(inst)))
	csi.RegisterIdentityServer(srv, &identityServer{d: d})
	csi.RegisterNodeServer(srv, &nodeServer{d: d, node: d.nodes.state(c.NodeID)})
	e.track(srv, serveGRPC(srv, lis, e.logger, "CSI mock node endpoint"), e.socket)

	if c.RegistrationDir != "" {
		e.regSocket = filepath.Join(c.RegistrationDir, d.cfg.Name+"-reg.sock")
		lis, err := listenUnix(e.regSocket)
		if err != nil {
			return nil, fmt.Errorf("node %s: registration: %w", c.NodeID, err)
		}
		reg := grpc.NewServer()
		registerapi.RegisterRegistrationServer(reg, &registrationServer{e: e})
		e.track(reg, serveGRPC(reg, lis, e.logger, "CSI mock registration"), e.regSocket)
	}
	e.logger.V(2).Info("CSI mock node endpoint serving", "endpoint", e.socket, "registration", e.regSocket, "driver", d.cfg.Name)
	return e, nil
}

func (e *NodeEndpoint) track(srv *grpc.Server, done chan struct{}, socket string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.servers = append(e.servers, srv)
	e.done = append(e.done, done)
	e.sockets = append(e.sockets, socket)
}

// NodeID is the node the endpoint serves.
func (e *NodeEndpoint) NodeID() string { return e.cfg.NodeID }

// Endpoint is the node plugin's socket path.
func (e *NodeEndpoint) Endpoint() string { return e.socket }

// RegistrationSocket is the registration socket's path ("" without
// NodeConfig.RegistrationDir).
func (e *NodeEndpoint) RegistrationSocket() string { return e.regSocket }

// Registration is what the kubelet has told the endpoint so far.
func (e *NodeEndpoint) Registration() RegistrationStatus {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.regStatus
}

// Stop stops serving and removes both sockets (the kubelet then
// unregisters the driver on this node); the node's staged and published
// volumes stay, so a new endpoint for the node finds them. Stop is
// idempotent.
func (e *NodeEndpoint) Stop() {
	e.mu.Lock()
	if e.stopped {
		e.mu.Unlock()
		return
	}
	e.stopped = true
	servers, done, sockets := e.servers, e.done, e.sockets
	close(e.down)
	e.mu.Unlock()
	// Registration first: the kubelet drops the plugin before its
	// endpoint goes away, as when node-driver-registrar exits first.
	for i := len(servers) - 1; i >= 0; i-- {
		servers[i].Stop()
		<-done[i]
	}
	for _, p := range sockets {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			e.logger.Error(err, "Cannot remove CSI mock node socket", "path", p)
		}
	}
	d := e.d
	d.nodes.mu.Lock()
	if d.nodes.endpoints[e.cfg.NodeID] == e {
		delete(d.nodes.endpoints, e.cfg.NodeID)
	}
	d.nodes.mu.Unlock()
	e.logger.V(2).Info("CSI mock node endpoint stopped", "endpoint", e.socket)
}

// registrationServer is the kubelet plugin-registration service of one
// node endpoint.
type registrationServer struct {
	registerapi.UnimplementedRegistrationServer
	e *NodeEndpoint
}

func (s *registrationServer) GetInfo(ctx context.Context, _ *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	s.e.mu.Lock()
	s.e.regStatus.InfoCalls++
	s.e.mu.Unlock()
	s.e.logger.V(4).Info("Kubelet asked for plugin info", "endpoint", s.e.socket)
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              s.e.d.cfg.Name,
		Endpoint:          s.e.socket,
		SupportedVersions: append([]string(nil), RegistrationSupportedVersions...),
	}, nil
}

func (s *registrationServer) NotifyRegistrationStatus(ctx context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	s.e.mu.Lock()
	s.e.regStatus.Notified = true
	s.e.regStatus.Registered = st.GetPluginRegistered()
	s.e.regStatus.Error = st.GetError()
	s.e.mu.Unlock()
	if st.GetPluginRegistered() {
		s.e.logger.V(2).Info("Kubelet registered the CSI driver", "driver", s.e.d.cfg.Name)
	} else {
		// What node-driver-registrar does is exit; the mock keeps serving
		// and records it, so a test can assert the kubelet's reason.
		s.e.logger.Error(errors.New(st.GetError()), "Kubelet refused to register the CSI driver", "driver", s.e.d.cfg.Name)
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

// NodeVolumes is one node's staged and published volumes in a State
// snapshot.
type NodeVolumes struct {
	// Staged maps a volume ID to its staging path.
	Staged map[string]string `json:"staged"`
	// Published maps a volume ID to its sorted target paths.
	Published map[string][]string `json:"published"`
}

// NodeVolumes returns node id's staged and published volumes.
func (d *Driver) NodeVolumes(id string) NodeVolumes {
	return d.nodes.state(id).snapshot()
}

// NodeEndpoints lists the node IDs with a running endpoint, sorted.
func (d *Driver) NodeEndpoints() []string {
	d.nodes.mu.Lock()
	defer d.nodes.mu.Unlock()
	out := make([]string, 0, len(d.nodes.endpoints))
	for id := range d.nodes.endpoints {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// NodeCalls returns the calls node id's endpoint got, oldest first.
func (d *Driver) NodeCalls(id string) []Call {
	var out []Call
	for _, c := range d.calls.calls() {
		if c.Endpoint == id {
			out = append(out, c)
		}
	}
	return out
}

// nodeSnapshots returns every node that has staged or published volumes.
func (d *Driver) nodeSnapshots() map[string]NodeVolumes {
	d.nodes.mu.Lock()
	states := make([]*nodeState, 0, len(d.nodes.states))
	for _, st := range d.nodes.states {
		states = append(states, st)
	}
	d.nodes.mu.Unlock()
	out := map[string]NodeVolumes{}
	for _, st := range states {
		if s := st.snapshot(); len(s.Staged)+len(s.Published) > 0 {
			out[st.id] = s
		}
	}
	return out
}

func (n *nodeState) snapshot() NodeVolumes {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := NodeVolumes{Staged: map[string]string{}, Published: map[string][]string{}}
	for vol, st := range n.staged {
		out.Staged[vol] = st.path
	}
	for vol, targets := range n.published {
		paths := make([]string, 0, len(targets))
		for p := range targets {
			paths = append(paths, p)
		}
		sort.Strings(paths)
		out.Published[vol] = paths
	}
	return out
}
