package csimock

import (
	"path/filepath"
	"testing"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"
	"k8s.io/klog/v2/ktesting"
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
	cfg.MaxVolumesPerNode = 3
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, ctx := ktesting.NewTestContext(t)
	dir := shortTempDir(t)
	sock := filepath.Join(dir, "csi.sock")
	if err := d.Start(ctx, sock); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)

	sc := sanity.NewTestConfig()
	sc.Address = "unix://" + sock
	sc.TargetPath = filepath.Join(dir, "target")
	sc.StagingPath = filepath.Join(dir, "staging")
	sc.TestVolumeParameters = map[string]string{"type": "mock"}
	sc.TestNodeVolumeAttachLimit = true
	sc.IdempotentCount = 3
	return sanityWorld{cfg: sc, check: func() {
		// Every volume the suite created was cleaned up through the driver.
		if st := d.State(); len(st.Volumes) != 0 || len(st.Nodes) != 0 {
			t.Errorf("single socket: left after sanity: volumes %+v, node volumes %+v", st.Volumes, st.Nodes)
		}
	}}
}
