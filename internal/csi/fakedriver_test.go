package csi

import (
	"context"
	"net"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/latchcsi/latch/internal/testsupport"
)

// fakeDriver implements just the Identity and Controller RPCs the client
// uses, scripted per test. (internal/csimock is the full mock driver; this
// package does not depend on it.)
type fakeDriver struct {
	csipb.UnimplementedIdentityServer
	csipb.UnimplementedControllerServer

	mu sync.Mutex
	// name is returned by GetPluginInfo.
	name       string
	pluginCaps []csipb.PluginCapability_Service_Type
	ctrlCaps   []csipb.ControllerServiceCapability_RPC_Type
	// probe scripts Probe: one entry per call, the last one repeats.
	probe []probeAnswer
	// publishErr, when set, is returned by ControllerPublishVolume.
	publishErr     error
	publishContext map[string]string
	// blockPublish makes ControllerPublishVolume wait for its ctx.
	blockPublish bool
	// volumes are listed by ListVolumes, pageSize at a time when the
	// request does not limit it.
	volumes []*csipb.ListVolumesResponse_Entry
	// repeatToken makes ListVolumes always answer with next token "1".
	repeatToken bool

	// Recorded calls.
	probeCalls     int
	ctrlCapsCalls  int
	publishReqs    []*csipb.ControllerPublishVolumeRequest
	unpublishReqs  []*csipb.ControllerUnpublishVolumeRequest
	listTokens     []string
	listMaxEntries []int32
}

type probeAnswer struct {
	ready *bool // nil: field absent
	err   error
}

func (d *fakeDriver) GetPluginInfo(context.Context, *csipb.GetPluginInfoRequest) (*csipb.GetPluginInfoResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return &csipb.GetPluginInfoResponse{Name: d.name, VendorVersion: "test"}, nil
}

func (d *fakeDriver) GetPluginCapabilities(context.Context, *csipb.GetPluginCapabilitiesRequest) (*csipb.GetPluginCapabilitiesResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	rsp := &csipb.GetPluginCapabilitiesResponse{}
	for _, c := range d.pluginCaps {
		rsp.Capabilities = append(rsp.Capabilities, &csipb.PluginCapability{
			Type: &csipb.PluginCapability_Service_{Service: &csipb.PluginCapability_Service{Type: c}},
		})
	}
	return rsp, nil
}

func (d *fakeDriver) Probe(context.Context, *csipb.ProbeRequest) (*csipb.ProbeResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.probeCalls++
	if len(d.probe) == 0 {
		return &csipb.ProbeResponse{}, nil
	}
	a := d.probe[0]
	if len(d.probe) > 1 {
		d.probe = d.probe[1:]
	}
	if a.err != nil {
		return nil, a.err
	}
	rsp := &csipb.ProbeResponse{}
	if a.ready != nil {
		rsp.Ready = wrapperspb.Bool(*a.ready)
	}
	return rsp, nil
}

func (d *fakeDriver) ControllerGetCapabilities(context.Context, *csipb.ControllerGetCapabilitiesRequest) (*csipb.ControllerGetCapabilitiesResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ctrlCapsCalls++
	rsp := &csipb.ControllerGetCapabilitiesResponse{}
	for _, c := range d.ctrlCaps {
		rsp.Capabilities = append(rsp.Capabilities, &csipb.ControllerServiceCapability{
			Type: &csipb.ControllerServiceCapability_Rpc{Rpc: &csipb.ControllerServiceCapability_RPC{Type: c}},
		})
	}
	return rsp, nil
}

func (d *fakeDriver) ControllerPublishVolume(ctx context.Context, req *csipb.ControllerPublishVolumeRequest) (*csipb.ControllerPublishVolumeResponse, error) {
	d.mu.Lock()
	d.publishReqs = append(d.publishReqs, req)
	block, err, pc := d.blockPublish, d.publishErr, d.publishContext
	d.mu.Unlock()
	if block {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if err != nil {
		return nil, err
	}
	return &csipb.ControllerPublishVolumeResponse{PublishContext: pc}, nil
}

func (d *fakeDriver) ControllerUnpublishVolume(_ context.Context, req *csipb.ControllerUnpublishVolumeRequest) (*csipb.ControllerUnpublishVolumeResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.unpublishReqs = append(d.unpublishReqs, req)
	return &csipb.ControllerUnpublishVolumeResponse{}, nil
}

func (d *fakeDriver) ListVolumes(_ context.Context, req *csipb.ListVolumesRequest) (*csipb.ListVolumesResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.listTokens = append(d.listTokens, req.StartingToken)
	d.listMaxEntries = append(d.listMaxEntries, req.MaxEntries)
	if d.repeatToken {
		return &csipb.ListVolumesResponse{NextToken: "1"}, nil
	}
	start := 0
	if req.StartingToken != "" {
		var err error
		if start, err = strconv.Atoi(req.StartingToken); err != nil {
			return nil, err
		}
	}
	size := int(req.MaxEntries)
	if size == 0 {
		size = len(d.volumes)
	}
	end := min(start+size, len(d.volumes))
	rsp := &csipb.ListVolumesResponse{Entries: d.volumes[start:end]}
	if end < len(d.volumes) {
		rsp.NextToken = strconv.Itoa(end)
	}
	return rsp, nil
}

// socketPath returns a short socket path: unix socket paths are limited to
// about 108 bytes, which t.TempDir() under a long test name can exceed.
func socketPath(t *testing.T) string {
	t.Helper()
	return filepath.Join(testsupport.SocketDir(t), "csi.sock")
}

// serve starts d on path and returns a function that stops the server.
func serve(t *testing.T, d *fakeDriver, path string) (stop func()) {
	t.Helper()
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	csipb.RegisterIdentityServer(srv, d)
	csipb.RegisterControllerServer(srv, d)
	go func() { _ = srv.Serve(lis) }()
	var once sync.Once
	stop = func() { once.Do(srv.Stop) }
	t.Cleanup(stop)
	return stop
}

// connectFake starts d and connects a client to it.
func connectFake(t *testing.T, ctx context.Context, d *fakeDriver, opts Options) *GRPCClient {
	t.Helper()
	path := socketPath(t)
	serve(t, d, path)
	opts.Address = "unix://" + path
	c, err := Connect(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func ptr[T any](v T) *T { return &v }
