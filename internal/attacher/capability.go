package attacher

import (
	"fmt"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-lib-utils/accessmodes"
)

// volumeCapability builds the CSI capability for ControllerPublishVolume:
// the access mode from the PV's access modes (csi-lib-utils' mapping, with
// SINGLE_NODE_MULTI_WRITER modes when the driver supports them), block or
// mount with fsType and mount options.
func volumeCapability(vol Volume, drv DriverInfo) (*csipb.VolumeCapability, error) {
	mode, err := accessmodes.ToCSIAccessMode(vol.AccessModes, drv.SupportsSingleNodeMultiWriter)
	if err != nil {
		return nil, fmt.Errorf("volume %q: %w", vol.Handle, err)
	}
	capability := &csipb.VolumeCapability{AccessMode: &csipb.VolumeCapability_AccessMode{Mode: mode}}
	if vol.Block {
		capability.AccessType = &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}}
	} else {
		capability.AccessType = &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{
			FsType: vol.FSType, MountFlags: vol.MountOptions,
		}}
	}
	return capability, nil
}
