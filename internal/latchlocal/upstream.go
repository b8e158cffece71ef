package latchlocal

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/latchcsi/latch/internal/attachdetach/controller"
	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/localcluster"
	"github.com/latchcsi/latch/internal/stack"
	"github.com/latchcsi/latch/internal/testsupport"
)

// With Options.Upstream (`latch-local up --upstream`), latch-local starts
// with upstream's pair where latch's controllers would run, so that an
// operator can rehearse docs/migration.md's swap on it:
//
//   - the mock driver's sidecar is the released external-attacher v4.13.0
//     (test/upstream/external-attacher, built on first use), running as
//     the driver's ServiceAccount default/csi-attacher with the RBAC
//     driver charts ship (driver_rbac.yaml) and upstream's deploy example
//     flags, with --leader-election in default;
//   - kube-controller-manager runs every controller, attachdetach
//     included (--controllers=*).
//
// latch's csi-attacher and attachdetach-controller run only once the
// operator starts them (`latch-local start`, control.go): in-process, as
// everywhere in latch-local, but authenticated as their ServiceAccounts
// (the driver's; deploy/attachdetach-controller's), so that the RBAC the
// runbook applies is what they run with.

// The components `latch-local start|stop|restart` name.
const (
	ExternalAttacher       = "external-attacher"
	CSIAttacher            = "csi-attacher"
	AttachDetachController = "attachdetach-controller"
	KubeControllerManager  = "kube-controller-manager"
)

// The driver controller's identity in upstream mode: its namespace (also
// its Lease's) and ServiceAccount, as driver_rbac.yaml creates them.
const (
	DriverNamespace      = "default"
	DriverServiceAccount = "csi-attacher"
)

// The attach/detach controller's ServiceAccount, as
// deploy/attachdetach-controller/rbac.yaml creates it.
const (
	ControllerNamespace      = "kube-system"
	ControllerServiceAccount = "latch-attachdetach-controller"
)

// UpstreamControllers is kube-controller-manager's --controllers in
// upstream mode: every controller, its attach/detach controller included.
var UpstreamControllers = []string{"*"}

//go:embed driver_rbac.yaml
var driverRBAC []byte

// tokenLifetime is how long the ServiceAccount tokens the components run
// with are valid: a latch-local session is shorter.
const tokenLifetime = 24 * time.Hour

// upstreamState is what upstream mode runs besides the stack; Env.mu
// guards it.
type upstreamState struct {
	dir              string // private: kubeconfigs, kube-controller-manager's files
	externalAttacher *stack.Upstream
	attacher         *stack.Component
	controller       *stack.Component
	kcm              *stack.Upstream
	kcmControllers   []string
	seq              int
}

// startUpstream applies the driver's RBAC and starts external-attacher as
// its ServiceAccount (the stack runs kube-controller-manager with
// UpstreamControllers).
func (e *Env) startUpstream(ctx context.Context) error {
	dir, err := os.MkdirTemp("", "latch-local-upstream")
	if err != nil {
		return fmt.Errorf("upstream mode: %w", err)
	}
	e.up = &upstreamState{dir: dir, kcm: e.stack.ControllerManager, kcmControllers: UpstreamControllers}
	if _, err := testsupport.ApplyRBAC(ctx, e.Client, driverRBAC); err != nil {
		return fmt.Errorf("upstream mode: the driver's RBAC: %w", err)
	}
	_, err = e.startExternalAttacher(ctx)
	return err
}

// serviceAccountConfig is a client configuration authenticated as the
// ServiceAccount namespace/name, with a token valid for tokenLifetime.
func (e *Env) serviceAccountConfig(ctx context.Context, namespace, name string) (*rest.Config, error) {
	secs := int64(tokenLifetime / time.Second)
	tok, err := e.Client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &secs},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("a token of ServiceAccount %s/%s: %w", namespace, name, err)
	}
	cfg := e.Cluster.AnonymousConfig()
	cfg.BearerToken = tok.Status.Token
	return cfg, nil
}

// leaseName is the driver's attacher Lease.
func (e *Env) leaseName() string { return kube.LeaseName(e.Opts.Driver) }

func (e *Env) startExternalAttacher(ctx context.Context) (string, error) {
	if e.up.externalAttacher != nil {
		return "", fmt.Errorf("%s: already running", ExternalAttacher)
	}
	cfg, err := e.serviceAccountConfig(ctx, DriverNamespace, DriverServiceAccount)
	if err != nil {
		return "", fmt.Errorf("%s: %w", ExternalAttacher, err)
	}
	e.up.seq++
	kubeconfig := filepath.Join(e.up.dir, fmt.Sprintf("external-attacher-%d.kubeconfig", e.up.seq))
	if err := localcluster.WriteKubeconfig(kubeconfig, cfg); err != nil {
		return "", fmt.Errorf("%s: %w", ExternalAttacher, err)
	}
	u, err := stack.StartUpstreamAttacher(ctx, stack.UpstreamAttacherConfig{
		Name: ExternalAttacher, CSIAddress: e.stack.Socket, Kubeconfig: kubeconfig,
		LeaderElection: true, LeaderElectionNamespace: DriverNamespace, Output: e.Opts.ProcessOutput,
	})
	if err != nil {
		return "", err
	}
	e.up.externalAttacher = u
	e.watch(u.Component)
	return fmt.Sprintf("%s: started (upstream v4.13.0, as ServiceAccount %s/%s, --leader-election in namespace %s): it attaches once it holds Lease %s/%s",
		ExternalAttacher, DriverNamespace, DriverServiceAccount, DriverNamespace, DriverNamespace, e.leaseName()), nil
}

func (e *Env) stopExternalAttacher() (string, error) {
	if e.up.externalAttacher == nil {
		return "", fmt.Errorf("%s: not running", ExternalAttacher)
	}
	u := e.up.externalAttacher
	e.up.externalAttacher = nil
	if err := u.Stop(); err != nil {
		return "", err
	}
	return fmt.Sprintf("%s: stopped; it does not release Lease %s/%s: the next attacher takes it over once it expires (15s)",
		ExternalAttacher, DriverNamespace, e.leaseName()), nil
}

// startCSIAttacher runs latch's csi-attacher in-process with the
// arguments external-attacher runs with (--leader-election in the
// driver's namespace), as the driver's ServiceAccount.
func (e *Env) startCSIAttacher(ctx context.Context) (string, error) {
	if e.up.attacher != nil {
		return "", fmt.Errorf("%s: already running", CSIAttacher)
	}
	sa, err := e.serviceAccountConfig(ctx, DriverNamespace, DriverServiceAccount)
	if err != nil {
		return "", fmt.Errorf("%s: %w", CSIAttacher, err)
	}
	cfg := stack.AttacherConfig(sa, e.stack.Socket)
	attacherConfig(0, &cfg)
	serveAttacherMetrics(e.Opts, &cfg)
	cfg.Leader.Presence = nil
	cfg.Leader.Enabled, cfg.Leader.Namespace = true, DriverNamespace
	e.up.attacher = e.stack.RunAttacher(ctx, CSIAttacher, cfg)
	return fmt.Sprintf("%s: started (latch's, as ServiceAccount %s/%s, --leader-election in namespace %s): it attaches once it holds Lease %s/%s",
		CSIAttacher, DriverNamespace, DriverServiceAccount, DriverNamespace, DriverNamespace, e.leaseName()), nil
}

func (e *Env) stopCSIAttacher() (string, error) {
	if e.up.attacher == nil {
		return "", fmt.Errorf("%s: not running", CSIAttacher)
	}
	a := e.up.attacher
	e.up.attacher = nil
	if err := a.Stop(); err != nil {
		return "", err
	}
	return fmt.Sprintf("%s: stopped; it released Lease %s/%s", CSIAttacher, DriverNamespace, e.leaseName()), nil
}

// kcmAttachDetach reports whether kube-controller-manager's --controllers
// list runs its attach/detach controller (by its old name or its new one).
func kcmAttachDetach(controllers []string) bool {
	names := []string{"attachdetach", "persistentvolume-attach-detach-controller"}
	for _, n := range names {
		if slices.Contains(controllers, n) {
			return true
		}
	}
	if !slices.Contains(controllers, "*") {
		return false
	}
	for _, n := range names {
		if slices.Contains(controllers, "-"+n) {
			return false
		}
	}
	return true
}

// restartKCM stops kube-controller-manager and starts it again with args
// (only --controllers=LIST; without it, the list it ran with).
func (e *Env) restartKCM(ctx context.Context, args []string) (string, error) {
	controllers := e.up.kcmControllers
	for _, a := range args {
		v, ok := strings.CutPrefix(a, "--controllers=")
		if !ok {
			return "", fmt.Errorf("%s: restart takes --controllers=LIST only, got %q", KubeControllerManager, a)
		}
		controllers = strings.Split(v, ",")
	}
	if kcmAttachDetach(controllers) && e.up.controller != nil {
		return "", fmt.Errorf("%s: --controllers=%s runs its attach/detach controller, and latch's %s runs: stop it first (latch-local stop %s); never run both",
			KubeControllerManager, strings.Join(controllers, ","), AttachDetachController, AttachDetachController)
	}
	if e.up.kcm != nil {
		old := e.up.kcm
		e.up.kcm = nil
		if err := old.Stop(); err != nil {
			return "", err
		}
	}
	e.up.seq++
	dir := filepath.Join(e.up.dir, fmt.Sprintf("kcm-%d", e.up.seq))
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", fmt.Errorf("%s: %w", KubeControllerManager, err)
	}
	u, err := stack.StartControllerManager(ctx, e.Cluster, stack.ControlPlaneConfig{Dir: dir, Output: e.Opts.ProcessOutput, Controllers: controllers})
	if err != nil {
		return "", fmt.Errorf("%s is not running: %w", KubeControllerManager, err)
	}
	e.up.kcm, e.up.kcmControllers = u, controllers
	e.watch(u.Component)
	state := "its attach/detach controller is off"
	if kcmAttachDetach(controllers) {
		state = "its attach/detach controller runs"
	}
	return fmt.Sprintf("%s: restarted with --controllers=%s (%s)", KubeControllerManager, strings.Join(controllers, ","), state), nil
}

// startController runs latch's attach/detach controller in-process as
// deploy/attachdetach-controller's ServiceAccount, with leader election
// on its Lease in kube-system as its Deployment runs it.
func (e *Env) startController(ctx context.Context) (string, error) {
	if e.up.controller != nil {
		return "", fmt.Errorf("%s: already running", AttachDetachController)
	}
	if e.up.kcm != nil && kcmAttachDetach(e.up.kcmControllers) {
		return "", fmt.Errorf("%s: %s runs its attach/detach controller (--controllers=%s): restart it without it first (latch-local restart %s --controllers='*,-attachdetach'); never run both",
			AttachDetachController, KubeControllerManager, strings.Join(e.up.kcmControllers, ","), KubeControllerManager)
	}
	_, err := e.Client.CoreV1().ServiceAccounts(ControllerNamespace).Get(ctx, ControllerServiceAccount, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", fmt.Errorf("%s: no ServiceAccount %s/%s: apply its RBAC first (kubectl apply -k deploy/attachdetach-controller)",
			AttachDetachController, ControllerNamespace, ControllerServiceAccount)
	}
	if err != nil {
		return "", fmt.Errorf("%s: %w", AttachDetachController, err)
	}
	sa, err := e.serviceAccountConfig(ctx, ControllerNamespace, ControllerServiceAccount)
	if err != nil {
		return "", fmt.Errorf("%s: %w", AttachDetachController, err)
	}
	var lease string
	e.up.controller = e.stack.StartController(ctx, func(c *controller.ServeConfig) {
		qps, burst := c.RESTConfig.QPS, c.RESTConfig.Burst
		c.RESTConfig = rest.CopyConfig(sa)
		c.RESTConfig.QPS, c.RESTConfig.Burst = qps, burst
		lease = c.Leader.Namespace + "/" + c.Leader.LeaseName
	})
	return fmt.Sprintf("%s: started (latch's, as ServiceAccount %s/%s, --leader-elect): it works once it holds Lease %s",
		AttachDetachController, ControllerNamespace, ControllerServiceAccount, lease), nil
}

func (e *Env) stopController() (string, error) {
	if e.up.controller == nil {
		return "", fmt.Errorf("%s: not running", AttachDetachController)
	}
	c := e.up.controller
	e.up.controller = nil
	if err := c.Stop(); err != nil {
		return "", err
	}
	return fmt.Sprintf("%s: stopped; it released its Lease", AttachDetachController), nil
}

// components is what runs in upstream mode, a line each.
func (e *Env) components() string {
	state := func(running bool) string {
		if running {
			return "running"
		}
		return "stopped"
	}
	kcm := state(e.up.kcm != nil)
	if e.up.kcm != nil {
		kcm += " --controllers=" + strings.Join(e.up.kcmControllers, ",")
	}
	return strings.Join([]string{
		ExternalAttacher + ": " + state(e.up.externalAttacher != nil),
		CSIAttacher + ": " + state(e.up.attacher != nil),
		KubeControllerManager + ": " + kcm,
		AttachDetachController + ": " + state(e.up.controller != nil),
	}, "\n") + "\n"
}

// stopUpstream stops what upstream mode started outside the stack (the
// stack stops the in-process controllers and its own
// kube-controller-manager) and removes its files.
func (e *Env) stopUpstream() error {
	if e.up == nil {
		return nil
	}
	var errs []error
	if e.up.externalAttacher != nil {
		errs = append(errs, e.up.externalAttacher.Stop())
	}
	if e.up.kcm != nil && e.up.kcm != e.stack.ControllerManager {
		errs = append(errs, e.up.kcm.Stop())
	}
	os.RemoveAll(e.up.dir)
	return errors.Join(errs...)
}
