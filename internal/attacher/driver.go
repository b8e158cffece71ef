package attacher

import (
	"context"
	"fmt"
	"time"

	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/csi"
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

// driverIdentity is the part of the CSI client start-up needs.
type driverIdentity interface {
	Probe(ctx context.Context) error
	DriverName(ctx context.Context) (string, error)
	Capabilities(ctx context.Context) (csi.Capabilities, error)
}

// DiscoverDriver probes the driver until it is ready, then reads its name
// and capabilities.
func DiscoverDriver(ctx context.Context, c driverIdentity, callTimeout time.Duration) (DriverFacts, error) {
	logger := klog.FromContext(ctx)
	if err := c.Probe(ctx); err != nil {
		return DriverFacts{}, fmt.Errorf("probe CSI driver: %w", err)
	}
	callCtx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	name, err := c.DriverName(callCtx)
	if err != nil {
		return DriverFacts{}, fmt.Errorf("GetPluginInfo: %w", err)
	}
	caps, err := c.Capabilities(callCtx)
	if err != nil {
		return DriverFacts{}, fmt.Errorf("capabilities of CSI driver %q: %w", name, err)
	}
	facts := DriverFacts{
		Info: DriverInfo{
			Name:                          name,
			SupportsReadOnly:              caps.PublishReadonly,
			SupportsSingleNodeMultiWriter: caps.SingleNodeMultiWriter,
		},
		Trivial:              !caps.ControllerService || !caps.PublishUnpublish,
		ListVolumesPublished: caps.ListVolumes && caps.ListVolumesPublishedNodes,
	}
	if facts.Trivial {
		logger.Info("CSI driver has no ControllerPublishVolume: every VolumeAttachment is marked attached without calling it",
			"driver", name, "controllerService", caps.ControllerService, "publishUnpublish", caps.PublishUnpublish)
	}
	logger.Info("CSI driver discovered", "driver", name, "trivial", facts.Trivial,
		"publishReadonly", caps.PublishReadonly, "singleNodeMultiWriter", caps.SingleNodeMultiWriter,
		"listVolumesPublishedNodes", facts.ListVolumesPublished)
	return facts, nil
}
