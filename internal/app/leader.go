// Package app holds the process plumbing both controllers share: leader
// election on a Lease and the HTTP endpoint for metrics and health.
package app

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
)

// LeaderElection configures RunAsLeader.
type LeaderElection struct {
	Enabled       bool
	LeaseName     string
	Namespace     string
	Identity      string // default: hostname + random suffix
	Labels        map[string]string
	LeaseDuration time.Duration
	RenewDeadline time.Duration
	RetryPeriod   time.Duration
}

// ErrLostLease is returned by RunAsLeader when the lease was lost while
// leading; the process should exit so that it restarts as a candidate.
var ErrLostLease = errors.New("lost the leader election lease")

// RunAsLeader runs run while this process holds the Lease (or at once when
// election is disabled). run's context is cancelled when the lease is lost
// or ctx is done. On ctx done the lease is released after run returns, so a
// standby takes over without waiting for the lease to expire.
// watchdog, when not nil, is fed to the elector for /healthz.
func RunAsLeader(ctx context.Context, client kubernetes.Interface, cfg LeaderElection, watchdog *leaderelection.HealthzAdaptor, run func(context.Context) error) error {
	logger := klog.FromContext(ctx)
	if !cfg.Enabled {
		return run(ctx)
	}
	if cfg.Identity == "" {
		host, _ := os.Hostname()
		cfg.Identity = fmt.Sprintf("%s_%d", host, time.Now().UnixNano())
	}
	if cfg.Namespace == "" {
		cfg.Namespace = inClusterNamespace()
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metaFor(cfg),
		Client:     client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: cfg.Identity},
		Labels:     cfg.Labels,
	}
	var runErr error
	lost := false
	leading := make(chan struct{})
	elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   cfg.LeaseDuration,
		RenewDeadline:   cfg.RenewDeadline,
		RetryPeriod:     cfg.RetryPeriod,
		ReleaseOnCancel: true,
		Name:            cfg.LeaseName,
		WatchDog:        watchdog,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(leaderCtx context.Context) {
				close(leading)
				logger.Info("Became leader, starting", "lease", klog.KRef(cfg.Namespace, cfg.LeaseName), "identity", cfg.Identity)
				runErr = run(leaderCtx)
			},
			OnStoppedLeading: func() {
				select {
				case <-ctx.Done():
					logger.Info("Released leader lease", "lease", klog.KRef(cfg.Namespace, cfg.LeaseName))
				default:
					lost = true
					logger.Error(nil, "Lost leader lease", "lease", klog.KRef(cfg.Namespace, cfg.LeaseName))
				}
			},
			OnNewLeader: func(identity string) {
				if identity != cfg.Identity {
					logger.Info("Another replica leads", "leader", identity)
				}
			},
		},
	})
	if err != nil {
		return fmt.Errorf("leader election: %w", err)
	}
	// Run returns when ctx is done or the lease is lost; with
	// ReleaseOnCancel the lease is given up after OnStartedLeading returns.
	elector.Run(ctx)
	if lost {
		return ErrLostLease
	}
	return runErr
}

func inClusterNamespace() string {
	if ns, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil && len(ns) > 0 {
		return string(ns)
	}
	return "default"
}

func metaFor(cfg LeaderElection) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: cfg.Namespace, Name: cfg.LeaseName}
}
