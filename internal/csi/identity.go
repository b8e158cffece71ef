package csi

import (
	"context"
	"errors"
	"fmt"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-lib-utils/rpc"
	"k8s.io/klog/v2"
)

// Capabilities are the driver capabilities that change what csi-attacher
// does.
type Capabilities struct {
	// ControllerService: plugin capability CONTROLLER_SERVICE. Without it
	// (or without PublishUnpublish) every VolumeAttachment is simply marked
	// attached.
	ControllerService bool
	// PublishUnpublish: PUBLISH_UNPUBLISH_VOLUME.
	PublishUnpublish bool
	// PublishReadonly: PUBLISH_READONLY; otherwise readonly must be false.
	PublishReadonly bool
	// ListVolumes: LIST_VOLUMES.
	ListVolumes bool
	// ListVolumesPublishedNodes: LIST_VOLUMES_PUBLISHED_NODES. The
	// ListVolumes reconcile needs both this and ListVolumes.
	ListVolumesPublishedNodes bool
	// SingleNodeMultiWriter: SINGLE_NODE_MULTI_WRITER, switches the access
	// mode mapping (see VolumeCapability).
	SingleNodeMultiWriter bool
}

// Probe calls the driver's Probe until it reports ready. A call that fails
// with an error IsFinalError calls non-final (timeout, unavailable, busy) or
// reports not ready is retried every ProbeInterval; a final error (for
// example Unimplemented or Internal) ends Probe, as does ctx.
func (c *GRPCClient) Probe(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for attempt := 1; ; attempt++ {
		select {
		case <-ctx.Done():
			return fmt.Errorf("probe CSI driver: gave up after %d attempts: %w", attempt-1, ctx.Err())
		case <-timer.C:
		}
		ready, err := c.probeOnce(ctx)
		switch {
		case err == nil && ready:
			logger.V(2).Info("CSI driver is ready", "attempts", attempt)
			return nil
		case err == nil:
			logger.Info("CSI driver is not ready yet", "attempt", attempt)
		case IsFinalError(err):
			return fmt.Errorf("probe CSI driver: %w", err)
		default:
			logger.Info("CSI driver probe failed; retrying", "attempt", attempt, "err", err)
		}
		timer.Reset(c.probeInterval)
	}
}

func (c *GRPCClient) probeOnce(ctx context.Context) (bool, error) {
	req := &csipb.ProbeRequest{}
	rsp, err := call(ctx, c, "Probe", req, c.identity.Probe)
	if err != nil {
		return false, err
	}
	// "If not present, the caller SHALL assume that the plugin is in a
	// ready state."
	if r := rsp.GetReady(); r != nil {
		return r.GetValue(), nil
	}
	return true, nil
}

// DriverName returns the name from GetPluginInfo.
func (c *GRPCClient) DriverName(ctx context.Context) (string, error) {
	req := &csipb.GetPluginInfoRequest{}
	rsp, err := call(ctx, c, "GetPluginInfo", req, c.identity.GetPluginInfo)
	if err != nil {
		return "", fmt.Errorf("get CSI driver name: %w", err)
	}
	if rsp.GetName() == "" {
		return "", errors.New("get CSI driver name: GetPluginInfo returned an empty name")
	}
	return rsp.GetName(), nil
}

// PluginCapabilities returns the set of plugin service capabilities.
func (c *GRPCClient) PluginCapabilities(ctx context.Context) (rpc.PluginCapabilitySet, error) {
	rsp, err := call(ctx, c, "GetPluginCapabilities", &csipb.GetPluginCapabilitiesRequest{}, c.identity.GetPluginCapabilities)
	if err != nil {
		return nil, fmt.Errorf("get CSI plugin capabilities: %w", err)
	}
	return typeSet(rsp.GetCapabilities(), func(p *csipb.PluginCapability) (csipb.PluginCapability_Service_Type, bool) {
		return p.GetService().GetType(), p.GetService() != nil
	}), nil
}

// ControllerCapabilities returns the set of controller RPC capabilities.
func (c *GRPCClient) ControllerCapabilities(ctx context.Context) (rpc.ControllerCapabilitySet, error) {
	rsp, err := call(ctx, c, "ControllerGetCapabilities", &csipb.ControllerGetCapabilitiesRequest{}, c.controller.ControllerGetCapabilities)
	if err != nil {
		return nil, fmt.Errorf("get CSI controller capabilities: %w", err)
	}
	return typeSet(rsp.GetCapabilities(), func(r *csipb.ControllerServiceCapability) (csipb.ControllerServiceCapability_RPC_Type, bool) {
		return r.GetRpc().GetType(), r.GetRpc() != nil
	}), nil
}

// typeSet is the set of the types of capabilities, skipping those typeOf
// does not know (a capability of another kind: ok false).
func typeSet[C any, T comparable](capabilities []C, typeOf func(C) (T, bool)) map[T]bool {
	set := map[T]bool{}
	for _, c := range capabilities {
		if t, ok := typeOf(c); ok {
			set[t] = true
		}
	}
	return set
}

// Capabilities asks for plugin capabilities and, only when the driver has a
// controller service, for controller capabilities (a driver without one
// may not implement ControllerGetCapabilities at all).
func (c *GRPCClient) Capabilities(ctx context.Context) (Capabilities, error) {
	plugin, err := c.PluginCapabilities(ctx)
	if err != nil {
		return Capabilities{}, err
	}
	caps := Capabilities{ControllerService: plugin[csipb.PluginCapability_Service_CONTROLLER_SERVICE]}
	if !caps.ControllerService {
		return caps, nil
	}
	ctrl, err := c.ControllerCapabilities(ctx)
	if err != nil {
		return Capabilities{}, err
	}
	caps.PublishUnpublish = ctrl[csipb.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME]
	caps.PublishReadonly = ctrl[csipb.ControllerServiceCapability_RPC_PUBLISH_READONLY]
	caps.ListVolumes = ctrl[csipb.ControllerServiceCapability_RPC_LIST_VOLUMES]
	caps.ListVolumesPublishedNodes = ctrl[csipb.ControllerServiceCapability_RPC_LIST_VOLUMES_PUBLISHED_NODES]
	caps.SingleNodeMultiWriter = ctrl[csipb.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER]
	return caps, nil
}
