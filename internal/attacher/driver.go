package attacher

import (
	"context"
	"fmt"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-lib-utils/rpc"
	"google.golang.org/grpc"
	"k8s.io/klog/v2"
)

// DriverFacts is what start-up learns from the driver.
type DriverFacts struct {
	Info DriverInfo
	// Trivial: no CONTROLLER_SERVICE or no PUBLISH_UNPUBLISH_VOLUME.
	Trivial bool
	// ListVolumesPublished: LIST_VOLUMES and LIST_VOLUMES_PUBLISHED_NODES,
	// which the ListVolumes reconcile needs.
	ListVolumesPublished bool
}

// DiscoverDriver probes the driver until it is ready, then reads its name
// and capabilities.
func DiscoverDriver(ctx context.Context, conn *grpc.ClientConn, callTimeout time.Duration) (DriverFacts, error) {
	logger := klog.FromContext(ctx)
	if err := rpc.ProbeForever(ctx, conn, callTimeout); err != nil {
		return DriverFacts{}, fmt.Errorf("probe CSI driver: %w", err)
	}
	callCtx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	name, err := rpc.GetDriverName(callCtx, conn)
	if err != nil {
		return DriverFacts{}, fmt.Errorf("GetPluginInfo: %w", err)
	}
	pluginCaps, err := rpc.GetPluginCapabilities(callCtx, conn)
	if err != nil {
		return DriverFacts{}, fmt.Errorf("GetPluginCapabilities of driver %q: %w", name, err)
	}
	facts := DriverFacts{Info: DriverInfo{Name: name}}
	if !pluginCaps[csipb.PluginCapability_Service_CONTROLLER_SERVICE] {
		facts.Trivial = true
		logger.Info("CSI driver has no controller service: every VolumeAttachment is marked attached without calling it", "driver", name)
		return facts, nil
	}
	ctrlCaps, err := rpc.GetControllerCapabilities(callCtx, conn)
	if err != nil {
		return DriverFacts{}, fmt.Errorf("ControllerGetCapabilities of driver %q: %w", name, err)
	}
	facts.Trivial = !ctrlCaps[csipb.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME]
	facts.Info.SupportsReadOnly = ctrlCaps[csipb.ControllerServiceCapability_RPC_PUBLISH_READONLY]
	facts.Info.SupportsSingleNodeMultiWriter = ctrlCaps[csipb.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER]
	facts.ListVolumesPublished = ctrlCaps[csipb.ControllerServiceCapability_RPC_LIST_VOLUMES] &&
		ctrlCaps[csipb.ControllerServiceCapability_RPC_LIST_VOLUMES_PUBLISHED_NODES]
	if facts.Trivial {
		logger.Info("CSI driver does not support PUBLISH_UNPUBLISH_VOLUME: every VolumeAttachment is marked attached without calling it", "driver", name)
	}
	logger.Info("CSI driver discovered", "driver", name, "trivial", facts.Trivial,
		"publishReadonly", facts.Info.SupportsReadOnly, "singleNodeMultiWriter", facts.Info.SupportsSingleNodeMultiWriter,
		"listVolumesPublishedNodes", facts.ListVolumesPublished)
	return facts, nil
}
