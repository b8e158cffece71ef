package stack

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/latchcsi/latch/internal/localcluster"
	"github.com/latchcsi/latch/internal/testsupport"
)

// The rest of a real control plane next to localcluster's API server: the
// real kube-scheduler and kube-controller-manager of Kubernetes v1.37.2
// (built by testsupport.UpstreamBinary), as child processes on loopback,
// without leader election, authenticated with the cluster's admin token
// (--use-service-account-credentials=false). kube-controller-manager runs
// every controller it enables by default except attachdetach, which is
// latch's: the PV binder, StatefulSet, ReplicaSet, garbage collector,
// namespace, node lifecycle, service-account (token and
// root-ca-cert-publisher, which writes the kube-root-ca.crt ConfigMap
// every Pod's service-account token volume needs), and so on.

// ControllersExceptAttachDetach is kube-controller-manager's --controllers
// for a control plane whose attach/detach controller is latch's.
var ControllersExceptAttachDetach = []string{"*", "-attachdetach"}

// ControlPlaneConfig configures StartScheduler and StartControllerManager.
type ControlPlaneConfig struct {
	// Dir holds the kubeconfig, the keys and the serving certificates;
	// it must exist (the caller removes it).
	Dir string
	// Output receives the process's log (nil: discarded).
	Output io.Writer
	// Args are extra flags, after the defaults (a later flag wins).
	Args []string
	// Controllers is kube-controller-manager's --controllers (default
	// ControllersExceptAttachDetach). A --controllers in Args would add
	// to it, not replace it: the flag is a list.
	Controllers []string
}

// StartControllerManager starts kube-controller-manager with every
// controller but attachdetach against cluster: its service-account token
// controller signs with the API server's own service-account key
// (localcluster's WriteServiceAccountKey) and its root-CA publisher
// publishes the cluster's CA. It returns once /healthz answers.
func StartControllerManager(ctx context.Context, cluster *localcluster.Cluster, c ControlPlaneConfig) (*Upstream, error) {
	kubeconfig := filepath.Join(c.Dir, "kubeconfig")
	key := filepath.Join(c.Dir, "sa.key")
	ca := filepath.Join(c.Dir, "ca.crt")
	if err := cluster.WriteKubeconfig(kubeconfig); err != nil {
		return nil, fmt.Errorf("kube-controller-manager: %w", err)
	}
	if err := cluster.WriteServiceAccountKey(ctx, key); err != nil {
		return nil, fmt.Errorf("kube-controller-manager: %w", err)
	}
	if err := cluster.WriteCA(ca); err != nil {
		return nil, fmt.Errorf("kube-controller-manager: %w", err)
	}
	certs := filepath.Join(c.Dir, "kcm-certs")
	if err := os.MkdirAll(certs, 0o700); err != nil {
		return nil, fmt.Errorf("kube-controller-manager: %w", err)
	}
	controllers := c.Controllers
	if len(controllers) == 0 {
		controllers = ControllersExceptAttachDetach
	}
	return StartKubeControllerManager(ctx, KubeControllerManagerConfig{
		Kubeconfig:  kubeconfig,
		Controllers: controllers,
		CertDir:     certs,
		Output:      c.Output,
		Args: append([]string{
			"--service-account-private-key-file=" + key,
			"--root-ca-file=" + ca,
		}, c.Args...),
	})
}

// SchedulerArgs are the flags StartScheduler passes (before its Args).
func SchedulerArgs(kubeconfig, secureAddr, certDir string) []string {
	host, port, _ := net.SplitHostPort(secureAddr)
	return []string{
		"--kubeconfig=" + kubeconfig,
		"--leader-elect=false",
		"--bind-address=" + host,
		"--secure-port=" + port,
		"--cert-dir=" + certDir,
		"--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
		"--v=2",
	}
}

// StartScheduler starts kube-scheduler against cluster and returns once
// its /healthz answers.
func StartScheduler(ctx context.Context, cluster *localcluster.Cluster, c ControlPlaneConfig) (*Upstream, error) {
	bin, err := testsupport.UpstreamBinary("kube-scheduler")
	if err != nil {
		return nil, err
	}
	kubeconfig := filepath.Join(c.Dir, "kubeconfig")
	if err := cluster.WriteKubeconfig(kubeconfig); err != nil {
		return nil, fmt.Errorf("kube-scheduler: %w", err)
	}
	certs := filepath.Join(c.Dir, "scheduler-certs")
	if err := os.MkdirAll(certs, 0o700); err != nil {
		return nil, fmt.Errorf("kube-scheduler: %w", err)
	}
	addr, err := freeLoopbackAddr()
	if err != nil {
		return nil, fmt.Errorf("kube-scheduler: %w", err)
	}
	cert := filepath.Join(certs, "kube-scheduler.crt")
	u := &Upstream{
		Args:       append(SchedulerArgs(kubeconfig, addr, certs), c.Args...),
		MetricsURL: "https://" + addr + "/metrics",
		HealthURL:  "https://" + addr + "/healthz",
		client: &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
			InsecureSkipVerify: true, //nolint:gosec // verified against the generated certificate below
			VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
				return verifyAgainstCertFile(cert, raw)
			},
		}}},
	}
	return u.startWith(ctx, "kube-scheduler", c.Output, bin, schedulerProcess)
}

// schedulerProcess is upstreamProcess for kube-scheduler, which without
// leader election ends its run on SIGTERM with the error "finished
// without leader elect" and exit status 1 (cmd/kube-scheduler/app's
// Run): after SIGTERM that status is how it stops, not a failure. Any
// exit before Stop is one.
func schedulerProcess(ctx context.Context, name string, out io.Writer, binary string, args ...string) (*Component, func(), error) {
	return child(ctx, name, out, func(err error) bool {
		var exit *exec.ExitError
		return diedOfTermOrKill(err) || errors.As(err, &exit) && exit.ExitCode() == 1
	}, binary, args...)
}

// startControlPlane starts what Options.Scheduler and
// Options.ControllerManager ask for.
func (s *Stack) startControlPlane(ctx context.Context) error {
	o := s.opts
	if !o.Scheduler && !o.ControllerManager {
		return nil
	}
	dir, err := os.MkdirTemp("", "latch-cp")
	if err != nil {
		return fmt.Errorf("control plane: %w", err)
	}
	s.cpDir = dir
	if o.ControllerManager {
		if s.ControllerManager, err = StartControllerManager(ctx, s.Cluster, ControlPlaneConfig{Dir: dir, Output: o.ControlPlaneOutput, Args: o.ControllerManagerArgs, Controllers: o.ControllerManagerControllers}); err != nil {
			return err
		}
		s.watch(s.ControllerManager.Component)
	}
	if o.Scheduler {
		if s.Scheduler, err = StartScheduler(ctx, s.Cluster, ControlPlaneConfig{Dir: dir, Output: o.ControlPlaneOutput, Args: o.SchedulerArgs}); err != nil {
			return err
		}
		s.watch(s.Scheduler.Component)
	}
	return nil
}

// stopControlPlane stops the scheduler and kube-controller-manager and
// removes their files.
func (s *Stack) stopControlPlane() []error {
	var errs []error
	for _, u := range []*Upstream{s.Scheduler, s.ControllerManager} {
		if u != nil {
			errs = append(errs, u.Stop())
		}
	}
	if s.cpDir != "" {
		os.RemoveAll(s.cpDir)
	}
	return errs
}
