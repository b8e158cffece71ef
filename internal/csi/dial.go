package csi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/kubernetes-csi/csi-lib-utils/connection"
	"github.com/kubernetes-csi/csi-lib-utils/metrics"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2"
)

// stillConnectingEvery is how often dial logs that it still waits for the
// driver, as csi-lib-utils does.
const stillConnectingEvery = 10 * time.Second

// dial connects to the driver at address (a unix:// target with an
// absolute path, or any other gRPC target) like csi-lib-utils'
// connection.Connect: no TLS, reconnect attempts at most a second apart,
// no idle timeout, csi_sidecar_operations_seconds through its metrics
// interceptor when mm is set; it blocks until the connection is ready,
// timeout passes or ctx ends. Unlike connection.Connect it adds no gRPC
// logging interceptor: logCall logs every call once, and that
// interceptor would log each one a second time at -v=5.
//
// For unix targets, onLoss (when set) is called once when the connection
// is lost after it was established; it is never re-established, so later
// calls fail with codes.Unavailable.
func dial(ctx context.Context, address string, timeout time.Duration, mm metrics.CSIMetricsManager, onLoss func()) (*grpc.ClientConn, error) {
	logger := klog.FromContext(ctx)
	bc := backoff.DefaultConfig
	bc.MaxDelay = time.Second
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: bc}),
		grpc.WithIdleTimeout(0),
	}
	if mm != nil {
		opts = append(opts, grpc.WithChainUnaryInterceptor(connection.ExtendedCSIMetricsManager{CSIMetricsManager: mm}.RecordMetricsClientInterceptor))
	}
	if path, ok := strings.CutPrefix(address, "unix://"); ok {
		opts = append(opts, grpc.WithContextDialer(unixDialer(ctx, address, path, onLoss)))
	}
	conn, err := grpc.NewClient(address, opts...)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ticker := time.NewTicker(stillConnectingEvery)
	defer ticker.Stop()
	conn.Connect()
	for {
		state := conn.GetState()
		switch state {
		case connectivity.Ready:
			return conn, nil
		case connectivity.Idle:
			conn.Connect()
		case connectivity.Shutdown:
			return nil, errors.New("connection shut down")
		}
		changed := make(chan bool, 1)
		go func() { changed <- conn.WaitForStateChange(ctx, state) }()
	wait:
		for {
			select {
			case <-ticker.C:
				logger.Info("Still connecting to the CSI driver", "address", address)
			case ok := <-changed:
				if !ok {
					_ = conn.Close()
					return nil, fmt.Errorf("no connection within %s (last state %s): %w", timeout, state, context.Cause(ctx))
				}
				break wait
			}
		}
	}
}

// unixDialer dials the socket at path. Once a connection was made, the
// next dial means gRPC lost it: the dialer reports the loss (once) and
// refuses to reconnect, since a restarted driver may have lost what the
// client learnt from it.
func unixDialer(ctx context.Context, address, path string, onLoss func()) func(context.Context, string) (net.Conn, error) {
	var mu sync.Mutex
	connected, lost := false, false
	return func(dialCtx context.Context, _ string) (net.Conn, error) {
		mu.Lock()
		if connected {
			if !lost {
				lost = true
				klog.FromContext(ctx).Error(nil, "Lost connection to the CSI driver", "address", address)
				if onLoss != nil {
					onLoss()
				}
			}
			mu.Unlock()
			return nil, errors.New("connection to the CSI driver lost; reconnecting is disabled")
		}
		mu.Unlock()
		var d net.Dialer
		conn, err := d.DialContext(dialCtx, "unix", path)
		if err == nil {
			mu.Lock()
			connected = true
			mu.Unlock()
		}
		return conn, err
	}
}
