package csi

import (
	"errors"
	"fmt"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-lib-utils/accessmodes"
	v1 "k8s.io/api/core/v1"
)

// CapabilityInput is what a VolumeCapability is derived from: the relevant
// parts of a PersistentVolume (or of an inline volume's spec) plus the
// sidecar's configuration and the driver's capabilities.
type CapabilityInput struct {
	// AccessModes of the PersistentVolume.
	AccessModes []v1.PersistentVolumeAccessMode
	// Block is true for volumeMode: Block; false (the API default) for
	// Filesystem.
	Block bool
	// FSType is spec.csi.fsType; empty means DefaultFSType.
	FSType string
	// DefaultFSType is --default-fstype; it may be empty, in which case the
	// driver picks.
	DefaultFSType string
	// MountOptions is spec.mountOptions.
	MountOptions []string
	// SingleNodeMultiWriter is true when the driver has the
	// SINGLE_NODE_MULTI_WRITER controller capability.
	SingleNodeMultiWriter bool
}

// VolumeCapability builds the capability sent with ControllerPublishVolume.
// It is a pure function with the same results as upstream
// external-attacher's GetVolumeCapabilities:
//
// Access mode (csi-lib-utils accessmodes.ToCSIAccessMode):
//
//	PV access modes             driver without SNMW         driver with SNMW
//	ReadWriteOncePod (alone)    SINGLE_NODE_WRITER          SINGLE_NODE_SINGLE_WRITER
//	ReadWriteOncePod + other    error                       error
//	ReadWriteMany (+ anything)  MULTI_NODE_MULTI_WRITER     MULTI_NODE_MULTI_WRITER
//	ReadOnlyMany + ReadWriteOnce error                      error
//	ReadOnlyMany                MULTI_NODE_READER_ONLY      MULTI_NODE_READER_ONLY
//	ReadWriteOnce               SINGLE_NODE_WRITER          SINGLE_NODE_MULTI_WRITER
//	none / unknown              error                       error
//
// Access type: Block gives a block capability (fsType and mount options do
// not apply and are ignored); otherwise a mount capability with FSType, or
// DefaultFSType when FSType is empty, and MountOptions as mount flags.
func VolumeCapability(in CapabilityInput) (*csipb.VolumeCapability, error) {
	mode, err := accessmodes.ToCSIAccessMode(in.AccessModes, in.SingleNodeMultiWriter)
	if err != nil {
		return nil, fmt.Errorf("map access modes %v to a CSI access mode: %w", in.AccessModes, err)
	}
	capability := &csipb.VolumeCapability{AccessMode: &csipb.VolumeCapability_AccessMode{Mode: mode}}
	if in.Block {
		capability.AccessType = &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}}
		return capability, nil
	}
	fsType := in.FSType
	if fsType == "" {
		fsType = in.DefaultFSType
	}
	capability.AccessType = &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{
		FsType:     fsType,
		MountFlags: in.MountOptions,
	}}
	return capability, nil
}

// VolumeCapabilityFromPVSpec is VolumeCapability for a CSI
// PersistentVolumeSpec (a PV's, or the one inside a VolumeAttachment's
// inlineVolumeSpec after CSI migration translation).
func VolumeCapabilityFromPVSpec(spec *v1.PersistentVolumeSpec, defaultFSType string, singleNodeMultiWriter bool) (*csipb.VolumeCapability, error) {
	if spec == nil || spec.CSI == nil {
		return nil, errors.New("build volume capability: PersistentVolumeSpec has no CSI source")
	}
	return VolumeCapability(CapabilityInput{
		AccessModes:           spec.AccessModes,
		Block:                 spec.VolumeMode != nil && *spec.VolumeMode == v1.PersistentVolumeBlock,
		FSType:                spec.CSI.FSType,
		DefaultFSType:         defaultFSType,
		MountOptions:          spec.MountOptions,
		SingleNodeMultiWriter: singleNodeMultiWriter,
	})
}

// PublishReadOnly returns the readonly flag for ControllerPublishVolume:
// the PV's spec.csi.readOnly, but only when the driver advertises
// PUBLISH_READONLY; drivers without it must always get false (they may
// reject the call otherwise).
func PublishReadOnly(pvReadOnly bool, caps Capabilities) bool {
	return pvReadOnly && caps.PublishReadonly
}
