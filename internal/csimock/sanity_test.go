package csimock

import (
	"path/filepath"
	"testing"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"k8s.io/klog/v2/ktesting"
)

// TestSanity runs the csi-test sanity suite against the driver over a real
// unix socket. The node service is enabled (the suite exercises it), the
// known-node set is the driver's own node (so "publish to a node that does
// not exist" is NotFound), and the attach-limit test is on.
func TestSanity(t *testing.T) {
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
	defer d.Stop()

	sc := sanity.NewTestConfig()
	sc.Address = "unix://" + sock
	sc.TargetPath = filepath.Join(dir, "target")
	sc.StagingPath = filepath.Join(dir, "staging")
	sc.TestVolumeParameters = map[string]string{"type": "mock"}
	sc.TestNodeVolumeAttachLimit = true
	sc.IdempotentCount = 3
	sanity.Test(t, sc)

	// Every volume the suite created was cleaned up through the driver.
	if st := d.State(); len(st.Volumes) != 0 {
		t.Errorf("volumes left after sanity: %+v", st.Volumes)
	}
}
