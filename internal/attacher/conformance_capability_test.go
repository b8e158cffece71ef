package attacher

import (
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/proto"
	v1 "k8s.io/api/core/v1"

	"github.com/latchcsi/latch/internal/csi"
	"github.com/latchcsi/latch/internal/csi/csitest"
)

// upstream: TestGetVolumeCapabilities, case by case: the capability the
// attacher publishes with for each combination of access modes, volume
// mode, fsType, mount options and SINGLE_NODE_MULTI_WRITER (default fsType
// ext4, as there).
func TestConformanceGetVolumeCapabilities(t *testing.T) {
	m := func(modes ...v1.PersistentVolumeAccessMode) []v1.PersistentVolumeAccessMode { return modes }
	cases := []struct {
		name  string
		in    csi.CapabilityInput
		want  *csipb.VolumeCapability // nil: an error
		snmwD bool
	}{
		{name: "RWX", in: csi.CapabilityInput{AccessModes: m(v1.ReadWriteMany)}, want: csitest.Mount(csitest.MNMW, "ext4")},
		{name: "Block RWX", in: csi.CapabilityInput{AccessModes: m(v1.ReadWriteMany), Block: true}, want: csitest.Block(csitest.MNMW)},
		{name: "RWX + specified fsType", in: csi.CapabilityInput{AccessModes: m(v1.ReadWriteMany), FSType: "ext3"}, want: csitest.Mount(csitest.MNMW, "ext3")},
		{name: "RWO", in: csi.CapabilityInput{AccessModes: m(v1.ReadWriteOnce)}, want: csitest.Mount(csitest.SNW, "ext4")},
		{name: "Block RWO", in: csi.CapabilityInput{AccessModes: m(v1.ReadWriteOnce), Block: true}, want: csitest.Block(csitest.SNW)},
		{name: "ROX", in: csi.CapabilityInput{AccessModes: m(v1.ReadOnlyMany)}, want: csitest.Mount(csitest.MNRO, "ext4")},
		{name: "RWX + anything", in: csi.CapabilityInput{AccessModes: m(v1.ReadWriteMany, v1.ReadOnlyMany, v1.ReadWriteOnce)}, want: csitest.Mount(csitest.MNMW, "ext4")},
		{name: "mount options", in: csi.CapabilityInput{AccessModes: m(v1.ReadWriteMany), MountOptions: []string{"first", "second"}}, want: csitest.Mount(csitest.MNMW, "ext4", "first", "second")},
		{name: "ROX+RWO", in: csi.CapabilityInput{AccessModes: m(v1.ReadWriteOnce, v1.ReadOnlyMany)}},
		{name: "nothing", in: csi.CapabilityInput{AccessModes: m()}},
		{name: "RWX with SINGLE_NODE_MULTI_WRITER capable driver", in: csi.CapabilityInput{AccessModes: m(v1.ReadWriteMany)}, snmwD: true, want: csitest.Mount(csitest.MNMW, "ext4")},
		{name: "ROX + RWO with SINGLE_NODE_MULTI_WRITER capable driver", in: csi.CapabilityInput{AccessModes: m(v1.ReadOnlyMany, v1.ReadWriteOnce)}, snmwD: true},
		{name: "ROX + RWOP with SINGLE_NODE_MULTI_WRITER capable driver", in: csi.CapabilityInput{AccessModes: m(v1.ReadOnlyMany, v1.ReadWriteOncePod)}, snmwD: true},
		{name: "RWO + RWOP with SINGLE_NODE_MULTI_WRITER capable driver", in: csi.CapabilityInput{AccessModes: m(v1.ReadWriteOnce, v1.ReadWriteOncePod)}, snmwD: true},
		{name: "ROX with SINGLE_NODE_MULTI_WRITER capable driver", in: csi.CapabilityInput{AccessModes: m(v1.ReadOnlyMany)}, snmwD: true, want: csitest.Mount(csitest.MNRO, "ext4")},
		{name: "RWO with SINGLE_NODE_MULTI_WRITER capable driver", in: csi.CapabilityInput{AccessModes: m(v1.ReadWriteOnce)}, snmwD: true, want: csitest.Mount(csitest.SNMW, "ext4")},
		{name: "RWOP with SINGLE_NODE_MULTI_WRITER capable driver", in: csi.CapabilityInput{AccessModes: m(v1.ReadWriteOncePod)}, snmwD: true, want: csitest.Mount(csitest.SNSW, "ext4")},
		{name: "nothing with SINGLE_NODE_MULTI_WRITER capable driver", in: csi.CapabilityInput{AccessModes: m()}, snmwD: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := tc.in
			in.DefaultFSType, in.SingleNodeMultiWriter = "ext4", tc.snmwD
			got, err := csi.VolumeCapability(in)
			if tc.want == nil {
				if err == nil {
					t.Fatalf("capability = %v, want an error", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got, tc.want) {
				t.Fatalf("capability = %v, want %v", got, tc.want)
			}
		})
	}
}
