package csimock

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"
	"k8s.io/klog/v2/ktesting"

	"github.com/latchcsi/latch/internal/testsupport"
)

// sanityWorld is one driver deployment the sanity suite runs against;
// check runs after the suite.
type sanityWorld struct {
	cfg   sanity.TestConfig
	check func()
}

// TestSanity runs the csi-test sanity suite against the driver over real
// unix sockets, in both deployments it supports: every service on one
// socket (sanitySingleSocket) and the controller on the driver's socket
// with the node plugin on a node endpoint (sanityNodeEndpoint). Ginkgo
// runs its specs once per process, so both worlds register their specs
// and one RunSpecs runs them all.
func TestSanity(t *testing.T) {
	worlds := []sanityWorld{sanitySingleSocket(t), sanityNodeEndpoint(t)}
	var contexts []*sanity.TestContext
	for i := range worlds {
		contexts = append(contexts, sanity.GinkgoTest(&worlds[i].cfg))
	}
	gomega.RegisterFailHandler(ginkgo.Fail)
	ginkgo.RunSpecs(t, "CSI Driver Test Suite")
	for _, sc := range contexts {
		sc.Finalize()
	}
	for _, w := range worlds {
		w.check()
	}
}

// sanitySingleSocket serves every service on one socket. The node service
// is enabled (the suite exercises it), the known-node set is the driver's
// own node (so "publish to a node that does not exist" is NotFound), and
// the attach-limit test is on.
func sanitySingleSocket(t *testing.T) sanityWorld {
	cfg := DefaultConfig()
	cfg.KnownNodes = []string{cfg.NodeID}
	d, _, dir, sock := startSanityDriver(t, cfg, "csi.sock")
	sc := sanityConfig(sock, dir)
	return sanityWorld{cfg: sc, check: func() {
		// Every volume the suite created was cleaned up through the driver.
		if st := d.State(); len(st.Volumes) != 0 || len(st.Nodes) != 0 {
			t.Errorf("single socket: left after sanity: volumes %+v, node volumes %+v", st.Volumes, st.Nodes)
		}
	}}
}

// startSanityDriver starts a driver with cfg, at most 3 volumes a node
// (what the suite's attach-limit test reads), on the socket named sock in
// a new short temporary directory dir; it stops when the test ends.
func startSanityDriver(t *testing.T, cfg Config, sock string) (d *Driver, ctx context.Context, dir, path string) {
	cfg.MaxVolumesPerNode = 3
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, ctx = ktesting.NewTestContext(t)
	dir = testsupport.SocketDir(t)
	path = filepath.Join(dir, sock)
	if err := d.Start(ctx, path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)
	return d, ctx, dir, path
}

// sanityConfig is the suite's configuration for the Node service on the
// socket sock, with the target and staging paths in dir, the attach-limit
// test on and every idempotency check repeated 3 times.
func sanityConfig(sock, dir string) sanity.TestConfig {
	sc := sanity.NewTestConfig()
	sc.Address = "unix://" + sock
	sc.TargetPath = filepath.Join(dir, "target")
	sc.StagingPath = filepath.Join(dir, "staging")
	sc.TestVolumeParameters = map[string]string{"type": "mock"}
	sc.TestNodeVolumeAttachLimit = true
	sc.IdempotentCount = 3
	return sc
}
