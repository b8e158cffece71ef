package csimock

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/latchcsi/latch/internal/csi/csitest"
)

func TestIdentity(t *testing.T) {
	t.Run("identity: GetPluginInfo returns the configured name and vendor version", func(t *testing.T) {
		cfg := DefaultConfig()
		cfg.Name, cfg.VendorVersion = "io.example.csi", "v9"
		e := newEnv(t, cfg)
		resp, err := e.ident.GetPluginInfo(testCtx(t), &csi.GetPluginInfoRequest{})
		if err != nil || resp.GetName() != "io.example.csi" || resp.GetVendorVersion() != "v9" {
			t.Fatalf("GetPluginInfo = %v, %v", resp, err)
		}
	})
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprintf("identity: CONTROLLER_SERVICE toggled %t", on), func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Capabilities.ControllerService = on
			e := newEnv(t, cfg)
			resp, err := e.ident.GetPluginCapabilities(testCtx(t), &csi.GetPluginCapabilitiesRequest{})
			if err != nil {
				t.Fatal(err)
			}
			got := len(resp.GetCapabilities()) == 1 && resp.GetCapabilities()[0].GetService().GetType() == csi.PluginCapability_Service_CONTROLLER_SERVICE
			if got != on {
				t.Fatalf("capabilities = %v, want controller service %t", resp.GetCapabilities(), on)
			}
		})
	}
	t.Run("identity: probe not ready for the configured duration, then ready; SetReady overrides", func(t *testing.T) {
		clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
		cfg := DefaultConfig()
		cfg.Clock = clk
		cfg.ProbeNotReadyFor = 10 * time.Second
		e := newEnv(t, cfg)
		probe := func() bool {
			t.Helper()
			resp, err := e.ident.Probe(testCtx(t), &csi.ProbeRequest{})
			if err != nil {
				t.Fatal(err)
			}
			return resp.GetReady().GetValue()
		}
		if probe() {
			t.Fatal("ready at start, want not ready")
		}
		clk.Step(10 * time.Second)
		if !probe() {
			t.Fatal("not ready after the period")
		}
		e.d.SetReady(false)
		if probe() {
			t.Fatal("ready after SetReady(false)")
		}
		e.d.SetReady(true)
		if !probe() {
			t.Fatal("not ready after SetReady(true)")
		}
	})
}

func TestControllerCapabilitiesToggle(t *testing.T) {
	all := map[string]csi.ControllerServiceCapability_RPC_Type{
		"CreateDeleteVolume":        csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		"PublishUnpublishVolume":    csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
		"PublishReadonly":           csi.ControllerServiceCapability_RPC_PUBLISH_READONLY,
		"ListVolumes":               csi.ControllerServiceCapability_RPC_LIST_VOLUMES,
		"ListVolumesPublishedNodes": csi.ControllerServiceCapability_RPC_LIST_VOLUMES_PUBLISHED_NODES,
		"SingleNodeMultiWriter":     csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
	}
	for field, capType := range all {
		t.Run("capabilities: "+field+" switched off is not advertised", func(t *testing.T) {
			cfg := DefaultConfig()
			reflect.ValueOf(&cfg.Capabilities).Elem().FieldByName(field).SetBool(false)
			e := newEnv(t, cfg)
			resp, err := e.ctrl.ControllerGetCapabilities(testCtx(t), &csi.ControllerGetCapabilitiesRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.GetCapabilities()) != len(all)-1 {
				t.Fatalf("got %d capabilities, want %d", len(resp.GetCapabilities()), len(all)-1)
			}
			for _, c := range resp.GetCapabilities() {
				if c.GetRpc().GetType() == capType {
					t.Fatalf("%s still advertised", capType)
				}
			}
		})
	}
}

func TestListVolumes(t *testing.T) {
	t.Run("list: paging with max_entries returns every volume once, with its published nodes", func(t *testing.T) {
		e := newEnv(t, DefaultConfig())
		for i := range 7 {
			e.seed(t, fmt.Sprintf("vol-%d", i))
		}
		e.mustPublish(t, "vol-3", "node-a", csitest.MNRO)
		e.mustPublish(t, "vol-3", "node-b", csitest.MNRO)
		got := map[string][]string{}
		token, pages := "", 0
		for {
			resp, err := e.ctrl.ListVolumes(testCtx(t), &csi.ListVolumesRequest{MaxEntries: 3, StartingToken: token})
			if err != nil {
				t.Fatal(err)
			}
			pages++
			if len(resp.GetEntries()) > 3 {
				t.Fatalf("page of %d entries, max 3", len(resp.GetEntries()))
			}
			for _, en := range resp.GetEntries() {
				if _, dup := got[en.GetVolume().GetVolumeId()]; dup {
					t.Fatalf("volume %s listed twice", en.GetVolume().GetVolumeId())
				}
				got[en.GetVolume().GetVolumeId()] = en.GetStatus().GetPublishedNodeIds()
			}
			if token = resp.GetNextToken(); token == "" {
				break
			}
		}
		if len(got) != 7 || pages != 3 {
			t.Fatalf("listed %d volumes in %d pages, want 7 in 3", len(got), pages)
		}
		if !reflect.DeepEqual(got["vol-3"], []string{"node-a", "node-b"}) {
			t.Fatalf("vol-3 published nodes = %v", got["vol-3"])
		}
	})
	t.Run("list: invalid starting token → Aborted", func(t *testing.T) {
		e := newEnv(t, DefaultConfig())
		_, err := e.ctrl.ListVolumes(testCtx(t), &csi.ListVolumesRequest{StartingToken: "invalid-token"})
		wantCode(t, err, codes.Aborted)
	})
	t.Run("list: negative max_entries → InvalidArgument", func(t *testing.T) {
		e := newEnv(t, DefaultConfig())
		_, err := e.ctrl.ListVolumes(testCtx(t), &csi.ListVolumesRequest{MaxEntries: -1})
		wantCode(t, err, codes.InvalidArgument)
	})
	t.Run("list: the token stays valid when the last volume of the page was deleted", func(t *testing.T) {
		e := newEnv(t, DefaultConfig())
		e.seed(t, "a", "b", "c", "d")
		resp, err := e.ctrl.ListVolumes(testCtx(t), &csi.ListVolumesRequest{MaxEntries: 2})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.ctrl.DeleteVolume(testCtx(t), &csi.DeleteVolumeRequest{VolumeId: "b"}); err != nil {
			t.Fatal(err)
		}
		resp, err = e.ctrl.ListVolumes(testCtx(t), &csi.ListVolumesRequest{StartingToken: resp.GetNextToken()})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, en := range resp.GetEntries() {
			ids = append(ids, en.GetVolume().GetVolumeId())
		}
		if !reflect.DeepEqual(ids, []string{"c", "d"}) || resp.GetNextToken() != "" {
			t.Fatalf("second page = %v (next %q), want [c d] and no token", ids, resp.GetNextToken())
		}
	})
	t.Run("list: without LIST_VOLUMES_PUBLISHED_NODES no status is reported", func(t *testing.T) {
		cfg := DefaultConfig()
		cfg.Capabilities.ListVolumesPublishedNodes = false
		e := newEnv(t, cfg)
		e.seed(t, "vol-1")
		e.mustPublish(t, "vol-1", "node-a", csitest.SNW)
		resp, err := e.ctrl.ListVolumes(testCtx(t), &csi.ListVolumesRequest{})
		if err != nil || len(resp.GetEntries()) != 1 || resp.GetEntries()[0].GetStatus() != nil {
			t.Fatalf("ListVolumes = %v, %v; want one entry without status", resp, err)
		}
	})
}
