package csi

import (
	"slices"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/klog/v2/ktesting"
)

// A volume listed on several pages (a driver that pages by offset while
// volumes come and go) keeps each published node ID once: node IDs do not
// pile up per page.
func TestListVolumes_aVolumeOnSeveralPagesKeepsEachNodeOnce(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	d := &fakeDriver{volumes: []*csipb.ListVolumesResponse_Entry{
		volumeEntry("v1", "n1"), volumeEntry("v2"),
		volumeEntry("v1", "n1", "n2"), volumeEntry("v2"),
		volumeEntry("v1", "n2"),
	}}
	c := connectFake(t, ctx, d, Options{})
	got, err := c.ListVolumes(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.listTokens) != 3 {
		t.Fatalf("pages read = %d, want 3", len(d.listTokens))
	}
	if !slices.Equal(got["v1"], []string{"n1", "n2"}) {
		t.Errorf("v1 published on %q, want [n1 n2]", got["v1"])
	}
	if nodes, ok := got["v2"]; !ok || len(nodes) != 0 {
		t.Errorf("v2 = %q (listed %v), want listed and published nowhere", nodes, ok)
	}
}
