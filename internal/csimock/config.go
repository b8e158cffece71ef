// Package csimock is a stateful, multi-node mock CSI driver with fault
// injection. It behaves like a careful real driver (spec error codes,
// idempotency, single-node exclusivity, attach limits) so that the
// attacher and attach/detach controllers are tested against something that
// pushes back, and it records every call so tests can assert what the
// controllers did.
package csimock

import (
	"fmt"
	"time"

	"k8s.io/utils/clock"
)

// Capabilities selects which optional CSI capabilities the driver
// advertises. A disabled capability also disables the behaviour behind it
// (for example ControllerPublishVolume returns Unimplemented without
// PublishUnpublishVolume), as a real driver in that mode would.
type Capabilities struct {
	// ControllerService is the CONTROLLER_SERVICE plugin capability. Without
	// it every Controller RPC returns Unimplemented.
	ControllerService bool `json:"controllerService"`

	CreateDeleteVolume        bool `json:"createDeleteVolume"`
	PublishUnpublishVolume    bool `json:"publishUnpublishVolume"`
	PublishReadonly           bool `json:"publishReadonly"`
	ListVolumes               bool `json:"listVolumes"`
	ListVolumesPublishedNodes bool `json:"listVolumesPublishedNodes"`
	SingleNodeMultiWriter     bool `json:"singleNodeMultiWriter"`
}

// AllCapabilities returns every capability switched on, which is what the
// attacher under test usually wants to see.
func AllCapabilities() Capabilities {
	return Capabilities{
		ControllerService:         true,
		CreateDeleteVolume:        true,
		PublishUnpublishVolume:    true,
		PublishReadonly:           true,
		ListVolumes:               true,
		ListVolumesPublishedNodes: true,
		SingleNodeMultiWriter:     true,
	}
}

// Config configures a Driver. The zero value is not useful; start from
// DefaultConfig.
type Config struct {
	// Name is returned by GetPluginInfo. It must be a valid CSI driver name.
	Name string
	// VendorVersion is returned by GetPluginInfo.
	VendorVersion string

	Capabilities Capabilities

	// NodeID is what the node service reports in NodeGetInfo; the node
	// service represents this one node.
	NodeID string
	// NodeService registers the CSI Node service. The controller side does
	// not need it; csi-sanity and a kubelet stand-in do.
	NodeService bool

	// MaxVolumesPerNode limits how many volumes may be published to one
	// node at once (ResourceExhausted beyond it). 0 means unlimited. It is
	// also reported by NodeGetInfo.
	MaxVolumesPerNode int64

	// KnownNodes, when non-empty, is the only set of node IDs that publish
	// accepts (NotFound otherwise). Empty means any node ID is accepted.
	// NodeID is always known. Nodes can also be added at runtime.
	KnownNodes []string

	// AutoCreateVolumes makes ControllerPublishVolume create an unknown
	// volume ID instead of returning NotFound; for benchmarks that do not
	// want to provision first.
	AutoCreateVolumes bool

	// SkipSingleNodeCheck disables the FailedPrecondition for a
	// single-node volume that is already published to another node. The
	// violation is still recorded in Stats, which lets a test prove that
	// the controllers themselves never multi-attach.
	SkipSingleNodeCheck bool

	// ProbeNotReadyFor makes Probe report not ready for this long after
	// New (measured on Clock). SetReady overrides it.
	ProbeNotReadyFor time.Duration

	// Backend, when set, models the storage system behind
	// ControllerPublishVolume and ControllerUnpublishVolume: latency,
	// capacity and request limit (backend.go; Profiles for built-in ones).
	// SetBackend replaces it at run time.
	Backend *Backend

	// Faults are installed at construction, as if added with AddFault.
	Faults []Rule

	// Seed seeds the random source of probabilistic fault rules that do
	// not carry their own seed, so runs are reproducible.
	Seed uint64

	// CallLogSize bounds the call log (oldest calls are dropped first).
	// 0 means DefaultCallLogSize.
	CallLogSize int

	// Clock is used for latency, probe readiness and call timestamps.
	// nil means the real clock.
	Clock clock.WithTicker
}

// DefaultCallLogSize keeps the last 100k calls, enough for benchmarks of a
// few thousand attaches without unbounded growth on a long-running driver.
const DefaultCallLogSize = 100000

// DefaultConfig returns a driver that advertises every capability, accepts
// any node ID and serves the node service for node "mock-node".
func DefaultConfig() Config {
	return Config{
		Name:          "mock.csi.latch.dev",
		VendorVersion: "v0.1.0",
		Capabilities:  AllCapabilities(),
		NodeID:        "mock-node",
		NodeService:   true,
	}
}

func (c *Config) validate() error {
	if c.Name == "" {
		return fmt.Errorf("driver name must not be empty")
	}
	if c.MaxVolumesPerNode < 0 {
		return fmt.Errorf("max volumes per node must not be negative, got %d", c.MaxVolumesPerNode)
	}
	if c.NodeService && c.NodeID == "" {
		return fmt.Errorf("node ID must be set when the node service is enabled")
	}
	if c.ProbeNotReadyFor < 0 {
		return fmt.Errorf("probe not-ready duration must not be negative, got %s", c.ProbeNotReadyFor)
	}
	if c.Backend != nil {
		if err := c.Backend.validate(); err != nil {
			return err
		}
	}
	for i := range c.Faults {
		if err := c.Faults[i].validate(); err != nil {
			return fmt.Errorf("fault %d: %w", i, err)
		}
	}
	return nil
}
