package csi

import (
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/proto"
	v1 "k8s.io/api/core/v1"

	"github.com/latchcsi/latch/internal/csi/csitest"
)

var (
	rwo  = []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}
	rox  = []v1.PersistentVolumeAccessMode{v1.ReadOnlyMany}
	rwx  = []v1.PersistentVolumeAccessMode{v1.ReadWriteMany}
	rwop = []v1.PersistentVolumeAccessMode{v1.ReadWriteOncePod}
)

func modes(m ...v1.PersistentVolumeAccessMode) []v1.PersistentVolumeAccessMode { return m }

func TestVolumeCapability_accessModes(t *testing.T) {
	const unknown = csipb.VolumeCapability_AccessMode_UNKNOWN
	tests := []struct {
		name     string
		modes    []v1.PersistentVolumeAccessMode
		without  csipb.VolumeCapability_AccessMode_Mode // driver without SINGLE_NODE_MULTI_WRITER; unknown = error
		withSNMW csipb.VolumeCapability_AccessMode_Mode // driver with it
	}{
		{"RWO", rwo, csitest.SNW, csitest.SNMW},
		{"RWOP", rwop, csitest.SNW, csitest.SNSW},
		{"ROX", rox, csitest.MNRO, csitest.MNRO},
		{"RWX", rwx, csitest.MNMW, csitest.MNMW},
		{"RWO+RWX: RWX wins", modes(v1.ReadWriteOnce, v1.ReadWriteMany), csitest.MNMW, csitest.MNMW},
		{"ROX+RWX: RWX wins", modes(v1.ReadOnlyMany, v1.ReadWriteMany), csitest.MNMW, csitest.MNMW},
		{"RWO+ROX+RWX: RWX wins", modes(v1.ReadWriteOnce, v1.ReadOnlyMany, v1.ReadWriteMany), csitest.MNMW, csitest.MNMW},
		{"RWO+ROX: impossible in CSI", modes(v1.ReadWriteOnce, v1.ReadOnlyMany), unknown, unknown},
		{"RWOP+RWO: RWOP must be alone", modes(v1.ReadWriteOncePod, v1.ReadWriteOnce), unknown, unknown},
		{"RWOP+RWX: RWOP must be alone", modes(v1.ReadWriteOncePod, v1.ReadWriteMany), unknown, unknown},
		{"RWOP twice counts as alone", modes(v1.ReadWriteOncePod, v1.ReadWriteOncePod), csitest.SNW, csitest.SNSW},
		{"RWO twice", modes(v1.ReadWriteOnce, v1.ReadWriteOnce), csitest.SNW, csitest.SNMW},
		{"no access modes", nil, unknown, unknown},
		{"unknown access mode", modes("ReadSometimes"), unknown, unknown},
	}
	for _, tt := range tests {
		for _, snmwCap := range []bool{false, true} {
			want := tt.without
			if snmwCap {
				want = tt.withSNMW
			}
			name := tt.name
			if snmwCap {
				name += "/driver has SINGLE_NODE_MULTI_WRITER"
			}
			t.Run(name, func(t *testing.T) {
				got, err := VolumeCapability(CapabilityInput{AccessModes: tt.modes, SingleNodeMultiWriter: snmwCap})
				if want == unknown {
					if err == nil {
						t.Fatalf("want error, got %v", got)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if got.GetAccessMode().GetMode() != want {
					t.Fatalf("access mode = %v, want %v", got.GetAccessMode().GetMode(), want)
				}
			})
		}
	}
}

func TestVolumeCapability_accessType(t *testing.T) {
	mount := func(fs string, flags ...string) *csipb.VolumeCapability {
		return csitest.Mount(csitest.SNW, fs, flags...)
	}
	block := csitest.Block(csitest.SNW)
	tests := []struct {
		name string
		in   CapabilityInput
		want *csipb.VolumeCapability
	}{
		{"fsType from PV", CapabilityInput{AccessModes: rwo, FSType: "xfs", DefaultFSType: "ext4"}, mount("xfs")},
		{"fsType defaulted", CapabilityInput{AccessModes: rwo, DefaultFSType: "ext4"}, mount("ext4")},
		{"no fsType and no default: driver decides", CapabilityInput{AccessModes: rwo}, mount("")},
		{"mount options become mount flags", CapabilityInput{AccessModes: rwo, FSType: "ext4", MountOptions: []string{"noatime", "discard"}}, mount("ext4", "noatime", "discard")},
		{"block ignores fsType and mount options", CapabilityInput{AccessModes: rwo, Block: true, FSType: "xfs", DefaultFSType: "ext4", MountOptions: []string{"noatime"}}, block},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := VolumeCapability(tt.in)
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got, tt.want) {
				t.Fatalf("capability = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestVolumeCapabilityFromPVSpec(t *testing.T) {
	block := v1.PersistentVolumeBlock
	fs := v1.PersistentVolumeFilesystem
	tests := []struct {
		name      string
		spec      *v1.PersistentVolumeSpec
		wantBlock bool
		wantFS    string
		wantErr   bool
	}{
		{name: "nil spec", spec: nil, wantErr: true},
		{name: "not CSI", spec: &v1.PersistentVolumeSpec{AccessModes: rwo}, wantErr: true},
		{name: "volumeMode unset is filesystem", spec: &v1.PersistentVolumeSpec{AccessModes: rwo, PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{}}}, wantFS: "ext4"},
		{name: "filesystem with fsType", spec: &v1.PersistentVolumeSpec{AccessModes: rwo, VolumeMode: &fs, PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{FSType: "xfs"}}}, wantFS: "xfs"},
		{name: "block", spec: &v1.PersistentVolumeSpec{AccessModes: rwo, VolumeMode: &block, PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{FSType: "xfs"}}}, wantBlock: true},
		{name: "bad access modes", spec: &v1.PersistentVolumeSpec{PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{}}}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := VolumeCapabilityFromPVSpec(tt.spec, "ext4", false)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("want error, got %v", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (got.GetBlock() != nil) != tt.wantBlock {
				t.Fatalf("block = %v, want %v", got.GetBlock() != nil, tt.wantBlock)
			}
			if !tt.wantBlock && got.GetMount().GetFsType() != tt.wantFS {
				t.Fatalf("fsType = %q, want %q", got.GetMount().GetFsType(), tt.wantFS)
			}
		})
	}
}

func TestPublishReadOnly(t *testing.T) {
	tests := []struct {
		pvReadOnly, driverSupports, want bool
	}{
		{false, false, false},
		{true, false, false}, // CO MUST send false without PUBLISH_READONLY
		{false, true, false},
		{true, true, true},
	}
	for _, tt := range tests {
		if got := PublishReadOnly(tt.pvReadOnly, Capabilities{PublishReadonly: tt.driverSupports}); got != tt.want {
			t.Errorf("PublishReadOnly(pv=%v, supports=%v) = %v, want %v", tt.pvReadOnly, tt.driverSupports, got, tt.want)
		}
	}
}
