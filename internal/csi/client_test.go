package csi

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"k8s.io/klog/v2/ktesting"
)

func TestConnect_plainPathAndDriverName(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	path := socketPath(t)
	serve(t, &fakeDriver{name: "csi.example.com"}, path)
	c, err := Connect(ctx, Options{Address: path})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	name, err := c.DriverName(ctx)
	if err != nil || name != "csi.example.com" {
		t.Fatalf("DriverName = %q, %v; want csi.example.com", name, err)
	}
}

func TestDriverName_emptyNameIsAnError(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	c := connectFake(t, ctx, &fakeDriver{}, Options{})
	if _, err := c.DriverName(ctx); err == nil {
		t.Fatal("empty driver name: want error")
	}
}

func TestConnect_retriesUntilTheSocketAppears(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	path := socketPath(t)
	type result struct {
		c   *GRPCClient
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := Connect(ctx, Options{Address: "unix://" + path, ConnectTimeout: 20 * time.Second})
		done <- result{c, err}
	}()
	time.Sleep(300 * time.Millisecond) // the driver starts late
	serve(t, &fakeDriver{name: "late.csi.io"}, path)
	r := <-done
	if r.err != nil {
		t.Fatalf("Connect: %v", r.err)
	}
	defer r.c.Close()
	if name, err := r.c.DriverName(ctx); err != nil || name != "late.csi.io" {
		t.Fatalf("DriverName = %q, %v", name, err)
	}
}

func TestConnect_givesUpAfterTimeout(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	start := time.Now()
	_, err := Connect(ctx, Options{Address: socketPath(t), ConnectTimeout: 300 * time.Millisecond})
	if err == nil {
		t.Fatal("Connect to a missing socket: want error")
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("Connect took %v, want about the 300ms timeout", d)
	}
}

func TestConnect_lostConnectionIsReported(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	path := socketPath(t)
	stop := serve(t, &fakeDriver{name: "d"}, path)
	c, err := Connect(ctx, Options{Address: path})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.DriverName(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.Lost():
		t.Fatal("Lost closed while connected")
	default:
	}
	stop()
	// gRPC notices the loss when it reconnects, at the latest on the next
	// call; that call must fail as "may be in progress", never as final.
	deadline := time.After(10 * time.Second)
	for {
		_, err := c.DriverName(ctx)
		select {
		case <-c.Lost():
			if err != nil && IsFinalError(err) {
				t.Fatalf("call on a lost connection failed with final error %v", err)
			}
			return
		case <-deadline:
			t.Fatal("Lost not closed after the driver went away")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func TestCapabilities(t *testing.T) {
	tests := []struct {
		name          string
		plugin        []csipb.PluginCapability_Service_Type
		ctrl          []csipb.ControllerServiceCapability_RPC_Type
		want          Capabilities
		wantCtrlCalls int
	}{
		{
			name:          "no controller service: controller capabilities not asked",
			plugin:        nil,
			ctrl:          []csipb.ControllerServiceCapability_RPC_Type{csipb.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME},
			want:          Capabilities{},
			wantCtrlCalls: 0,
		},
		{
			name:          "controller service without publish",
			plugin:        []csipb.PluginCapability_Service_Type{csipb.PluginCapability_Service_CONTROLLER_SERVICE},
			ctrl:          []csipb.ControllerServiceCapability_RPC_Type{csipb.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME},
			want:          Capabilities{ControllerService: true},
			wantCtrlCalls: 1,
		},
		{
			name:   "everything",
			plugin: []csipb.PluginCapability_Service_Type{csipb.PluginCapability_Service_CONTROLLER_SERVICE, csipb.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS},
			ctrl: []csipb.ControllerServiceCapability_RPC_Type{
				csipb.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
				csipb.ControllerServiceCapability_RPC_PUBLISH_READONLY,
				csipb.ControllerServiceCapability_RPC_LIST_VOLUMES,
				csipb.ControllerServiceCapability_RPC_LIST_VOLUMES_PUBLISHED_NODES,
				csipb.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
			},
			want:          Capabilities{ControllerService: true, PublishUnpublish: true, PublishReadonly: true, ListVolumes: true, ListVolumesPublishedNodes: true, SingleNodeMultiWriter: true},
			wantCtrlCalls: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			d := &fakeDriver{pluginCaps: tt.plugin, ctrlCaps: tt.ctrl}
			c := connectFake(t, ctx, d, Options{})
			got, err := c.Capabilities(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Fatalf("Capabilities = %+v, want %+v", got, tt.want)
			}
			if d.ctrlCapsCalls != tt.wantCtrlCalls {
				t.Fatalf("ControllerGetCapabilities called %d times, want %d", d.ctrlCapsCalls, tt.wantCtrlCalls)
			}
		})
	}
}

func TestProbe_retriesUntilReady(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	d := &fakeDriver{probe: []probeAnswer{
		{ready: ptr(false)},
		{err: status.Error(codes.Unavailable, "starting")},
		{err: status.Error(codes.DeadlineExceeded, "slow")},
		{ready: nil}, // absent means ready
	}}
	c := connectFake(t, ctx, d, Options{ProbeInterval: 10 * time.Millisecond})
	if err := c.Probe(ctx); err != nil {
		t.Fatalf("Probe: %v", err)
	}
	if d.probeCalls != 4 {
		t.Fatalf("Probe called %d times, want 4", d.probeCalls)
	}
}

func TestProbe_finalErrorStopsAtOnce(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	d := &fakeDriver{probe: []probeAnswer{{err: status.Error(codes.FailedPrecondition, "broken config")}}}
	c := connectFake(t, ctx, d, Options{ProbeInterval: 10 * time.Millisecond})
	err := c.Probe(ctx)
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Probe error = %v, want FailedPrecondition", err)
	}
	if d.probeCalls != 1 {
		t.Fatalf("Probe called %d times, want 1", d.probeCalls)
	}
}

func TestProbe_givesUpWhenContextEnds(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	d := &fakeDriver{probe: []probeAnswer{{ready: ptr(false)}}}
	c := connectFake(t, ctx, d, Options{ProbeInterval: 10 * time.Millisecond})
	ctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if err := c.Probe(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Probe error = %v, want context.DeadlineExceeded", err)
	}
	if d.probeCalls < 2 {
		t.Fatalf("Probe called %d times, want retries", d.probeCalls)
	}
}

func TestControllerPublish_sendsTheRequestAndReturnsPublishContext(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	d := &fakeDriver{publishContext: map[string]string{"devicePath": "/dev/xvdb"}}
	c := connectFake(t, ctx, d, Options{})
	capability, err := VolumeCapability(CapabilityInput{AccessModes: rwo, FSType: "xfs"})
	if err != nil {
		t.Fatal(err)
	}
	req := PublishRequest{
		VolumeID: "vol-1", NodeID: "node-1", Capability: capability, ReadOnly: true,
		VolumeContext: map[string]string{"pool": "a"}, Secrets: map[string]string{"key": "v"},
	}
	pc, err := c.ControllerPublish(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(pc, d.publishContext) {
		t.Fatalf("publish context = %v, want %v", pc, d.publishContext)
	}
	want := &csipb.ControllerPublishVolumeRequest{
		VolumeId: "vol-1", NodeId: "node-1", VolumeCapability: capability, Readonly: true,
		VolumeContext: map[string]string{"pool": "a"}, Secrets: map[string]string{"key": "v"},
	}
	if len(d.publishReqs) != 1 || !proto.Equal(d.publishReqs[0], want) {
		t.Fatalf("driver got %v, want exactly %v", d.publishReqs, want)
	}
}

func TestControllerPublish_driverErrorKeepsItsCode(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	d := &fakeDriver{publishErr: status.Error(codes.NotFound, "no such volume")}
	c := connectFake(t, ctx, d, Options{})
	_, err := c.ControllerPublish(ctx, PublishRequest{VolumeID: "vol-1", NodeID: "node-1"})
	if status.Code(err) != codes.NotFound || !IsFinalError(err) {
		t.Fatalf("error = %v (code %v, final %v), want final NotFound", err, status.Code(err), IsFinalError(err))
	}
	for _, want := range []string{"ControllerPublishVolume", `"vol-1"`, `"node-1"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
}

func TestControllerPublish_callTimeoutIsNotFinal(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	d := &fakeDriver{blockPublish: true}
	c := connectFake(t, ctx, d, Options{CallTimeout: 100 * time.Millisecond})
	_, err := c.ControllerPublish(ctx, PublishRequest{VolumeID: "vol-1", NodeID: "node-1"})
	if status.Code(err) != codes.DeadlineExceeded || IsFinalError(err) {
		t.Fatalf("error = %v, want non-final DeadlineExceeded", err)
	}
}

func TestControllerUnpublish_sendsTheRequest(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	d := &fakeDriver{}
	c := connectFake(t, ctx, d, Options{})
	if err := c.ControllerUnpublish(ctx, "vol-1", "node-1", map[string]string{"k": "v"}); err != nil {
		t.Fatal(err)
	}
	want := &csipb.ControllerUnpublishVolumeRequest{VolumeId: "vol-1", NodeId: "node-1", Secrets: map[string]string{"k": "v"}}
	if len(d.unpublishReqs) != 1 || !proto.Equal(d.unpublishReqs[0], want) {
		t.Fatalf("driver got %v, want exactly %v", d.unpublishReqs, want)
	}
}

func volumeEntry(id string, nodes ...string) *csipb.ListVolumesResponse_Entry {
	return &csipb.ListVolumesResponse_Entry{
		Volume: &csipb.Volume{VolumeId: id},
		Status: &csipb.ListVolumesResponse_VolumeStatus{PublishedNodeIds: nodes},
	}
}

func TestListVolumes_readsAllPages(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	d := &fakeDriver{volumes: []*csipb.ListVolumesResponse_Entry{
		volumeEntry("v1", "n1"), volumeEntry("v2"), volumeEntry("v3", "n1", "n2"), volumeEntry("v4", "n3"), volumeEntry("v5", "n2"),
	}}
	c := connectFake(t, ctx, d, Options{})
	got, err := c.ListVolumes(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{"v1": {"n1"}, "v2": nil, "v3": {"n1", "n2"}, "v4": {"n3"}, "v5": {"n2"}}
	if len(got) != len(want) {
		t.Fatalf("ListVolumes = %v, want %v", got, want)
	}
	for id, nodes := range want {
		if g, ok := got[id]; !ok || !slices.Equal(g, nodes) {
			t.Fatalf("ListVolumes[%s] = %v, want %v (full result %v)", id, g, nodes, got)
		}
	}
	if !slices.Equal(d.listTokens, []string{"", "2", "4"}) || !slices.Equal(d.listMaxEntries, []int32{2, 2, 2}) {
		t.Fatalf("pages requested with tokens %q and max entries %v, want [\"\" 2 4] and [2 2 2]", d.listTokens, d.listMaxEntries)
	}
}

func TestListVolumes_repeatedTokenIsAnErrorNotALoop(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	d := &fakeDriver{repeatToken: true}
	c := connectFake(t, ctx, d, Options{})
	if _, err := c.ListVolumes(ctx, 0); err == nil {
		t.Fatal("want error for a token the driver already returned")
	}
	if len(d.listTokens) != 2 {
		t.Fatalf("ListVolumes called %d times, want 2", len(d.listTokens))
	}
}

func TestLogging_secretsNeverReachTheLog(t *testing.T) {
	const secret = "s3cr3t-Passw0rd"
	logs := publishUnpublishLogged(t, 10, secret, [3]string{"vol-1", "vol-1", "vol-1"})
	for _, want := range []string{"Calling CSI driver", "ControllerPublishVolume", "ControllerUnpublishVolume", "vol-1", "***stripped***"} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %q; the calls were not logged:\n%s", want, logs)
		}
	}
	if strings.Contains(logs, secret) {
		t.Fatalf("secret value found in the log:\n%s", logs)
	}
}
