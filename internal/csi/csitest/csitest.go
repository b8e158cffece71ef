// Package csitest is the shorthand tests use to write CSI volume
// capabilities: the access modes by their initials, and mount and block
// capabilities built from a mode. Only tests import it.
package csitest

import csipb "github.com/container-storage-interface/spec/lib/go/csi"

// The CSI access modes by their initials.
const (
	SNW  = csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
	SNRO = csipb.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY
	SNSW = csipb.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER
	SNMW = csipb.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER
	MNRO = csipb.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
	MNMW = csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER
)

// Mount is a filesystem capability with mode, fsType ("" lets the driver
// choose) and mount flags.
func Mount(mode csipb.VolumeCapability_AccessMode_Mode, fsType string, flags ...string) *csipb.VolumeCapability {
	return &csipb.VolumeCapability{
		AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{FsType: fsType, MountFlags: flags}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: mode},
	}
}

// Block is a raw block capability with mode.
func Block(mode csipb.VolumeCapability_AccessMode_Mode) *csipb.VolumeCapability {
	return &csipb.VolumeCapability{
		AccessType: &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: mode},
	}
}
