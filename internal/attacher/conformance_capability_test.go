package attacher

import (
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/proto"
	v1 "k8s.io/api/core/v1"

	"github.com/latchcsi/latch/internal/csi"
)

// upstream: TestGetVolumeCapabilities, case by case: the capability the
// attacher publishes with for each combination of access modes, volume
// mode, fsType, mount options and SINGLE_NODE_MULTI_WRITER (default fsType
// ext4, as there).
func TestConformanceGetVolumeCapabilities(t *testing.T) {
	const (
		snw  = csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
		snsw = csipb.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER
		snmw = csipb.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER
		mnro = csipb.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
		mnmw = csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER
	)
	mount := func(fs string, mode csipb.VolumeCapability_AccessMode_Mode, flags ...string) *csipb.VolumeCapability {
		return &csipb.VolumeCapability{
			AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{FsType: fs, MountFlags: flags}},
			AccessMode: &csipb.VolumeCapability_AccessMode{Mode: mode},
		}
	}
	block := func(mode csipb.VolumeCapability_AccessMode_Mode) *csipb.VolumeCapability {
		return &csipb.VolumeCapability{
			AccessType: &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}},
			AccessMode: &csipb.VolumeCapability_AccessMode{Mode: mode},
		}
	}
	m := func(modes ...v1.PersistentVolumeAccessMode) []v1.PersistentVolumeAccessMode { return modes }
	cases := []struct {
		name  string
		in    csi.CapabilityInput
		want  *csipb.VolumeCapability // nil: an error
		snmwD bool
	}{
		{name: "RWX", in: csi.CapabilityInput{AccessModes: m(v1.ReadWriteMany)}, want: mount("ext4", mnmw)},
		{name: "Block RWX", in: csi.CapabilityInput{AccessModes: m(v1.ReadWriteMany), Block: true}, want: block(mnmw)},
		{name: "RWX + specified fsType", in: csi.CapabilityInput{AccessModes: m(v1.ReadWriteMany), FSType: "ext3"}, want: mount("ext3", mnmw)},
		{name: "RWO", in: csi.CapabilityInput{AccessModes: m(v1.ReadWriteOnce)}, want: mount("ext4", snw)},
		{name: "Block RWO", in: csi.CapabilityInput{AccessModes: m(v1.ReadWriteOnce), Block: true}, want: block(snw)},
		{name: "ROX", in: csi.CapabilityInput{AccessModes: m(v1.ReadOnlyMany)}, want: mount("ext4", mnro)},
		{name: "RWX + anything", in: csi.CapabilityInput{AccessModes: m(v1.ReadWriteMany, v1.ReadOnlyMany, v1.ReadWriteOnce)}, want: mount("ext4", mnmw)},
		{name: "mount options", in: csi.CapabilityInput{AccessModes: m(v1.ReadWriteMany), MountOptions: []string{"first", "second"}}, want: mount("ext4", mnmw, "first", "second")},
		{name: "ROX+RWO", in: csi.CapabilityInput{AccessModes: m(v1.ReadWriteOnce, v1.ReadOnlyMany)}},
		{name: "nothing", in: csi.CapabilityInput{AccessModes: m()}},
		{name: "RWX with SINGLE_NODE_MULTI_WRITER capable driver", in: csi.CapabilityInput{AccessModes: m(v1.ReadWriteMany)}, snmwD: true, want: mount("ext4", mnmw)},
		{name: "ROX + RWO with SINGLE_NODE_MULTI_WRITER capable driver", in: csi.CapabilityInput{AccessModes: m(v1.ReadOnlyMany, v1.ReadWriteOnce)}, snmwD: true},
		{name: "ROX + RWOP with SINGLE_NODE_MULTI_WRITER capable driver", in: csi.CapabilityInput{AccessModes: m(v1.ReadOnlyMany, v1.ReadWriteOncePod)}, snmwD: true},
		{name: "RWO + RWOP with SINGLE_NODE_MULTI_WRITER capable driver", in: csi.CapabilityInput{AccessModes: m(v1.ReadWriteOnce, v1.ReadWriteOncePod)}, snmwD: true},
		{name: "ROX with SINGLE_NODE_MULTI_WRITER capable driver", in: csi.CapabilityInput{AccessModes: m(v1.ReadOnlyMany)}, snmwD: true, want: mount("ext4", mnro)},
		{name: "RWO with SINGLE_NODE_MULTI_WRITER capable driver", in: csi.CapabilityInput{AccessModes: m(v1.ReadWriteOnce)}, snmwD: true, want: mount("ext4", snmw)},
		{name: "RWOP with SINGLE_NODE_MULTI_WRITER capable driver", in: csi.CapabilityInput{AccessModes: m(v1.ReadWriteOncePod)}, snmwD: true, want: mount("ext4", snsw)},
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
