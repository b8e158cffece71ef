package csimock

import (
	"path/filepath"
	"testing"
)

// sanityNodeEndpoint deploys the driver the way a cluster does: the
// controller on the driver's own socket (no Node service there) and the
// node plugin on a node endpoint's socket, sharing one volume store. The
// suite's node tests publish to the node ID the endpoint's NodeGetInfo
// reports, then stage and publish on the endpoint's socket.
func sanityNodeEndpoint(t *testing.T) sanityWorld {
	cfg := DefaultConfig()
	cfg.NodeService = false
	cfg.KnownNodes = []string{"node-1"}
	d, ctx, dir, ctrl := startSanityDriver(t, cfg, "controller.sock")
	ep, err := d.StartNode(ctx, NodeConfig{NodeID: "node-1", Socket: filepath.Join(dir, "node.sock")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ep.Stop)

	sc := sanityConfig(ep.Endpoint(), dir)
	sc.ControllerAddress = "unix://" + ctrl
	return sanityWorld{cfg: sc, check: func() {
		if st := d.State(); len(st.Volumes) != 0 || len(st.Nodes) != 0 {
			t.Errorf("node endpoint: left after sanity: volumes %+v, node volumes %+v", st.Volumes, st.Nodes)
		}
		// The suite's node tests ran against the endpoint, and only there.
		staged := 0
		for _, c := range d.Calls() {
			if c.Method == "NodeStageVolume" && c.CodeName == "OK" {
				if c.Endpoint != "node-1" || c.NodeID != "node-1" {
					t.Errorf("node endpoint: NodeStageVolume logged on endpoint %q node %q, want node-1", c.Endpoint, c.NodeID)
				}
				staged++
			}
		}
		if staged == 0 {
			t.Error("node endpoint: the sanity suite staged nothing on the node endpoint")
		}
	}}
}
