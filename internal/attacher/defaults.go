package attacher

import (
	"time"

	"github.com/latchcsi/latch/internal/app"
)

// DefaultCSIAddress is --csi-address' default.
const DefaultCSIAddress = "/run/csi/socket"

// DefaultConfig is the controller configuration csi-attacher runs with
// when no flag changes it: the one source of the flag defaults
// (cmd/csi-attacher/options.go) and of every rig that runs the attacher
// "as the binary does" (bench, latch-local, internal/stack).
func DefaultConfig() Config {
	return Config{
		Workers:            DefaultWorkers,
		Timeout:            15 * time.Second,
		RetryIntervalStart: time.Second,
		RetryIntervalMax:   5 * time.Minute,
		ReconcileSync:      time.Minute,
		ReconcileTimeout:   2 * time.Minute,
	}
}

// DefaultSidecarConfig is RunSidecar's configuration with csi-attacher's
// flag defaults, RESTConfig left to the caller. Leader election is off
// (--leader-election=false) but its timings are the flags' defaults.
func DefaultSidecarConfig() SidecarConfig {
	return SidecarConfig{
		CSIAddress:     DefaultCSIAddress,
		ConnectTimeout: time.Minute,
		Resync:         10 * time.Minute,
		Controller:     DefaultConfig(),
		Leader: app.LeaderElection{
			LeaseDuration: 15 * time.Second,
			RenewDeadline: 10 * time.Second,
			RetryPeriod:   5 * time.Second,
		},
		HTTP: app.HTTPConfig{MetricsPath: "/metrics"},
	}
}
