// Package app holds the process plumbing both controllers share: leader
// election on a Lease and the HTTP endpoint for metrics and health.
package app

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"
	// leader_election_master_status (and leader_election_slowpath_total)
	// in the legacy registry, through client-go's leader election metrics
	// provider, as external-attacher and kube-controller-manager register
	// them.
	_ "k8s.io/component-base/metrics/prometheus/clientgo/leaderelection"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/runner"
)

// LeaderElection configures RunAsLeader.
type LeaderElection struct {
	Enabled       bool
	LeaseName     string
	Namespace     string
	Identity      string // default: DefaultIdentity()
	Labels        map[string]string
	LeaseDuration time.Duration
	RenewDeadline time.Duration
	RetryPeriod   time.Duration
	// Recorder, when set, gets the elector's LeaderElection events on the
	// Lease ("<identity> became leader", "<identity> stopped leading"),
	// which the external-attacher and kube-controller-manager record too.
	// Nil records none. Only with Enabled: presence writes no events.
	Recorder record.EventRecorder
	// Presence, when set and Enabled is false, still holds the Lease while
	// working and refuses to work while another identity holds it
	// (runWithPresence). Nil keeps the plain behaviour: run at once.
	Presence *Presence
}

// DefaultIdentity is the Lease holder identity of a process that names
// none: its host name and its start time in nanoseconds, so that a
// restarted container on the same host is a new candidate.
func DefaultIdentity() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s_%d", host, time.Now().UnixNano())
}

// ErrLostLease is returned by RunAsLeader when the lease was lost while
// leading; the process should exit so that it restarts as a candidate.
var ErrLostLease = errors.New("lost the leader election lease")

// RunAsLeader runs run while this process holds the Lease (or at once when
// election is disabled, or, with cfg.Presence, once it holds the Lease
// without electing: see runWithPresence). run's context is cancelled when the lease is lost
// or ctx is done.
//
// Shutdown order matters for a standby: when ctx is done, run's context is
// cancelled and RunAsLeader waits for run to return (run drains the work in
// flight, bounded by its own drain timeout) before the lease is released.
// When the lease is lost instead, run's context carries the lease's context
// as its abort context (runner.WithAbort), so the controller runners
// cancel the work in flight at once: another replica may already lead.
// Releasing first would let a standby start while this process still has
// driver calls in flight; keeping the lease until it expires would leave
// the volumes unattended for a whole lease duration. When run returns on
// its own, the lease is released too. watchdog, when not nil, is fed to
// the elector for /healthz.
func RunAsLeader(ctx context.Context, client kubernetes.Interface, cfg LeaderElection, watchdog *leaderelection.HealthzAdaptor, run func(context.Context) error) error {
	logger := klog.FromContext(ctx)
	if !cfg.Enabled && cfg.Presence == nil {
		return run(ctx)
	}
	if cfg.Identity == "" {
		cfg.Identity = DefaultIdentity()
	}
	if cfg.Namespace == "" {
		cfg.Namespace = inClusterNamespace()
	}
	if !cfg.Enabled {
		return runWithPresence(ctx, client, cfg, run)
	}
	lock := releaseGuardedLock{&resourcelock.LeaseLock{
		LeaseMeta:  metaFor(cfg),
		Client:     client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: cfg.Identity, EventRecorder: cfg.Recorder},
		Labels:     cfg.Labels,
	}}

	// The elector gets a context of its own: cancelling it ends renewal and
	// releases the lease, which must happen only after run has drained.
	electCtx, stopElecting := context.WithCancel(context.WithoutCancel(ctx))
	defer stopElecting()

	var (
		mu      sync.Mutex
		leading bool
		runErr  error
		lost    bool
	)
	ran := make(chan struct{})
	stopWatching := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if !leading {
			stopElecting() // still a candidate: stop at once
		}
		// When leading, OnStartedLeading stops electing once run returns.
	})
	defer stopWatching()

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
				mu.Lock()
				if ctx.Err() != nil {
					mu.Unlock()
					stopElecting()
					return
				}
				leading = true
				mu.Unlock()
				defer close(ran)
				defer stopElecting()
				logger.Info("Became leader, starting", "lease", klog.KRef(cfg.Namespace, cfg.LeaseName), "identity", cfg.Identity)
				runCtx, cancelRun := context.WithCancel(leaderCtx)
				defer cancelRun()
				// A lost lease aborts the work in flight instead of
				// letting it drain: another replica may lead already.
				// (leaderCtx is otherwise cancelled only after run returns.)
				runCtx = runner.WithAbort(runCtx, leaderCtx)
				stop := context.AfterFunc(ctx, cancelRun)
				defer stop()
				err := run(runCtx)
				// The elector cancels leaderCtx when renewal fails; we
				// cancel it (through electCtx) only after this returns.
				leaseLost := leaderCtx.Err() != nil && ctx.Err() == nil
				mu.Lock()
				runErr, lost = err, leaseLost
				mu.Unlock()
				if leaseLost {
					logger.Error(nil, "Lost leader lease", "lease", klog.KRef(cfg.Namespace, cfg.LeaseName))
				}
			},
			OnStoppedLeading: func() {
				logger.Info("Stopped leading", "lease", klog.KRef(cfg.Namespace, cfg.LeaseName))
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
	// Run returns when electCtx is done (lease released) or the lease is
	// lost; either way run's context is cancelled by then.
	elector.Run(electCtx)
	mu.Lock()
	wasLeading := leading
	mu.Unlock()
	if wasLeading {
		<-ran
	}
	mu.Lock()
	defer mu.Unlock()
	if lost {
		return ErrLostLease
	}
	return runErr
}

// inClusterNamespace is the Lease's namespace when no flag names one, as
// csi-lib-utils' leader election finds it for external-attacher: the
// POD_NAMESPACE environment variable, else the ServiceAccount's namespace,
// else "default".
func inClusterNamespace() string {
	return namespaceFrom(os.Getenv("POD_NAMESPACE"), "/var/run/secrets/kubernetes.io/serviceaccount/namespace")
}

func namespaceFrom(env, serviceAccountFile string) string {
	if env != "" {
		return env
	}
	if ns, err := os.ReadFile(serviceAccountFile); err == nil {
		if ns := strings.TrimSpace(string(ns)); ns != "" {
			return ns
		}
	}
	return "default"
}

func metaFor(cfg LeaderElection) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: cfg.Namespace, Name: cfg.LeaseName}
}
