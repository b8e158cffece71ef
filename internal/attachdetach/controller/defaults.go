package controller

import (
	"time"

	"github.com/latchcsi/latch/internal/app"
)

// DefaultKubeAPIQPS and DefaultKubeAPIBurst are the client-side limits of
// attachdetach-controller's client (--kube-api-qps, --kube-api-burst).
const (
	DefaultKubeAPIQPS   = 500
	DefaultKubeAPIBurst = 1000
)

// DefaultNodeStatusWorkers is how many nodes' status.volumesAttached are
// written at once (--node-status-workers). Each write is one PATCH whose
// time is the API server's; in a burst (volumes of many nodes attaching
// at once) the writes of different nodes wait for each other when there
// are too few workers, and the kubelet waits for its node's write before
// it mounts (docs/scale.md, "Trickle and recovery burst" and "Worker
// counts at full size").
const DefaultNodeStatusWorkers = 48

// DefaultWorkers is how many (volume, node) keys are reconciled at once,
// and how many Pods are recorded at once (--concurrent-attach-detach-syncs).
// A pass mostly waits for one API write (a VolumeAttachment created or
// deleted), so the count bounds how many of those a burst has in flight
// (docs/scale.md, "Worker counts at full size").
const DefaultWorkers = 150

// DefaultUnseenWriteCheck is Config.UnseenWriteCheck's default. The
// informer shows the controller's own creates and deletes within moments;
// one it has not shown for this long was most likely made while its watch
// was down, and the API server is asked about it.
const DefaultUnseenWriteCheck = 10 * time.Second

// DefaultLeaseName and DefaultLeaseNamespace name the leader election
// Lease (--leader-elect-resource-name, --leader-elect-resource-namespace).
const (
	DefaultLeaseName      = "latch-attachdetach-controller"
	DefaultLeaseNamespace = "kube-system"
)

// DefaultConfig is the controller configuration attachdetach-controller
// runs with when no flag changes it: the one source of the flag defaults
// (cmd/attachdetach-controller/options.go) and of every rig that runs the
// controller "as the binary does" (bench, latch-local, internal/stack).
func DefaultConfig() Config {
	return Config{
		Workers:           DefaultWorkers,
		NodeStatusWorkers: DefaultNodeStatusWorkers,
		MaxWaitForUnmount: 6 * time.Minute,
		VerifyPeriod:      time.Minute,
		UnseenWriteCheck:  DefaultUnseenWriteCheck,
		CoexistencePeriod: DefaultCoexistencePeriod,
	}
}

// DefaultServeConfig is Serve's configuration with the binary's flag
// defaults, apart from RESTConfig, the HTTP endpoint and Registry, which
// the caller chooses. Leader election is on, as --leader-elect is.
func DefaultServeConfig() ServeConfig {
	return ServeConfig{
		Controller: DefaultConfig(),
		Leader: app.LeaderElection{
			Enabled:       true,
			LeaseName:     DefaultLeaseName,
			Namespace:     DefaultLeaseNamespace,
			LeaseDuration: 15 * time.Second,
			RenewDeadline: 10 * time.Second,
			RetryPeriod:   2 * time.Second,
		},
		HTTP: app.HTTPConfig{MetricsPath: "/metrics"},
	}
}
