package csi

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-lib-utils/metrics"
	"google.golang.org/grpc"
	"k8s.io/klog/v2"
)

// Client is what csi-attacher needs from a CSI driver. Implementations must
// be safe for concurrent use. Every method honours ctx and, on top of it,
// the per-call timeout the client was built with. Errors wrap the gRPC
// status of the driver (status.FromError / IsFinalError work on them) and
// name the RPC and the volume/node involved.
type Client interface {
	// Probe blocks until the driver reports ready, ctx is done, or the
	// driver answers with a final error.
	Probe(ctx context.Context) error
	// DriverName is GetPluginInfo's name; an empty name is an error.
	DriverName(ctx context.Context) (string, error)
	// Capabilities combines the plugin and controller capabilities that
	// change csi-attacher's behaviour.
	Capabilities(ctx context.Context) (Capabilities, error)
	// ControllerPublish attaches a volume to a node and returns the
	// driver's publish context. It is idempotent on the driver side.
	ControllerPublish(ctx context.Context, req PublishRequest) (publishContext map[string]string, err error)
	// ControllerUnpublish detaches a volume from a node. A volume that is
	// already detached is not an error (CSI spec).
	ControllerUnpublish(ctx context.Context, volumeID, nodeID string, secrets map[string]string) error
	// ListVolumes returns, for every volume the driver knows, the IDs of
	// the nodes it reports the volume published on, reading all pages.
	ListVolumes(ctx context.Context, maxEntries int32) (map[string][]string, error)
}

var _ Client = (*GRPCClient)(nil)

// Options configure Connect.
type Options struct {
	// Address is the driver's socket: "unix:///path", "/path" or a relative
	// path. Other gRPC targets work but cannot report connection loss.
	Address string
	// ConnectTimeout bounds the initial connection attempts (retried every
	// second at most). Default 1 minute, like upstream --csi-address
	// handling.
	ConnectTimeout time.Duration
	// CallTimeout is applied to every RPC (upstream --timeout); 0 means only
	// the caller's ctx bounds the call.
	CallTimeout time.Duration
	// ProbeInterval is the pause between two Probe calls while the driver
	// is not ready. Default 1s.
	ProbeInterval time.Duration
	// MetricsManager, when set, records csi_sidecar_operations_seconds for
	// every call (csi-lib-utils interceptor).
	MetricsManager metrics.CSIMetricsManager
	// MaxLogLength caps the logged request and answer of a call (after
	// secrets are stripped) at that many characters; 0 or less: no cap
	// (csi-attacher's --max-grpc-log-length).
	MaxLogLength int
	// ListVolumesMaxPages is the page budget of one ListVolumes listing;
	// 0 means DefaultListVolumesMaxPages.
	ListVolumesMaxPages int
}

// GRPCClient is the Client over a gRPC connection made by dial.
type GRPCClient struct {
	conn          *grpc.ClientConn
	identity      csipb.IdentityClient
	controller    csipb.ControllerClient
	callTimeout   time.Duration
	probeInterval time.Duration
	maxLogLength  int
	listMaxPages  int

	lost     chan struct{}
	lostOnce sync.Once
}

// Connect dials the driver, retrying until ConnectTimeout or ctx ends. The
// connection is never re-established after it is lost: a restarted driver
// may have lost in-memory state that csi-attacher derived from it
// (capabilities, name), so the binary must exit and start over, which is
// what upstream does. Lost reports the loss; calls made afterwards fail
// with codes.Unavailable, which IsFinalError treats as "may be in
// progress", so no detach is ever assumed.
func Connect(ctx context.Context, opts Options) (*GRPCClient, error) {
	if opts.ConnectTimeout <= 0 {
		opts.ConnectTimeout = time.Minute
	}
	if opts.ProbeInterval <= 0 {
		opts.ProbeInterval = time.Second
	}
	if opts.ListVolumesMaxPages <= 0 {
		opts.ListVolumesMaxPages = DefaultListVolumesMaxPages
	}
	address, err := normalizeAddress(opts.Address)
	if err != nil {
		return nil, err
	}
	c := &GRPCClient{
		callTimeout:   opts.CallTimeout,
		probeInterval: opts.ProbeInterval,
		maxLogLength:  opts.MaxLogLength,
		listMaxPages:  opts.ListVolumesMaxPages,
		lost:          make(chan struct{}),
	}
	klog.FromContext(ctx).V(2).Info("Connecting to CSI driver", "address", address, "timeout", opts.ConnectTimeout)
	conn, err := dial(ctx, address, opts.ConnectTimeout, opts.MetricsManager, func() {
		c.lostOnce.Do(func() { close(c.lost) })
	})
	if err != nil {
		return nil, fmt.Errorf("connect to CSI driver at %q: %w", address, err)
	}
	c.conn = conn
	c.identity = csipb.NewIdentityClient(conn)
	c.controller = csipb.NewControllerClient(conn)
	return c, nil
}

// normalizeAddress turns plain paths into unix:// targets with an absolute
// path: gRPC's unix resolver rejects "unix://relative" (it would parse
// "relative" as an authority).
func normalizeAddress(address string) (string, error) {
	if address == "" {
		return "", errors.New("connect to CSI driver: empty address")
	}
	path, isUnix := strings.CutPrefix(address, "unix://")
	if !isUnix && strings.Contains(address, "://") {
		return address, nil
	}
	if !isUnix {
		path = address
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", fmt.Errorf("connect to CSI driver: resolve socket path %q: %w", path, err)
	}
	return "unix://" + abs, nil
}

// Lost is closed when the connection to the driver is lost for good.
func (c *GRPCClient) Lost() <-chan struct{} {
	return c.lost
}

// Close closes the connection.
func (c *GRPCClient) Close() error {
	return c.conn.Close()
}

// callContext applies the per-call timeout.
func (c *GRPCClient) callContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if c.callTimeout > 0 {
		return context.WithTimeout(ctx, c.callTimeout)
	}
	return context.WithCancel(ctx)
}

// call makes one CSI call, method, of c: with c's per-call timeout, logged
// (logCall) with its request and answer.
func call[Req, Rsp any](ctx context.Context, c *GRPCClient, method string, req Req, rpc func(context.Context, Req, ...grpc.CallOption) (Rsp, error)) (Rsp, error) {
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	done := logCall(ctx, method, req, c.maxLogLength)
	rsp, err := rpc(ctx, req)
	done(rsp, err)
	return rsp, err
}
