// Package attachdetach_test runs the attach/detach controller end to end
// on the in-process kube-apiserver. Most tests run the kubelet stand-in
// and csi-attacher in trivial mode (it marks every VolumeAttachment of its
// driver attached); the tests whose subject is the Pod's lifecycle on a
// node run the real kubelet instead (envOptions.realKubelet: hollow kubelets,
// the mock driver and the real csi-attacher), where every attach and
// every detach is checked against the kubelet ordering contract
// (kubeletorder). Tests run one after the other, each with its own
// controller, driver, namespace and nodes; each cleans up what it made so
// the next test's controller does not act on it.
package attachdetach_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/component-base/metrics"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/attachdetach/controller"
	"github.com/latchcsi/latch/internal/attacher"
	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/localcluster"
	"github.com/latchcsi/latch/internal/stack"
	"github.com/latchcsi/latch/internal/testsupport"
)

var cluster *localcluster.Cluster

func TestMain(m *testing.M) { stack.RunTestMain(m, &cluster) }

// envNames names each test's namespace and driver ad<n>.
var envNames = stack.Worlds{Prefix: "ad"}

// env is one test's end-to-end rig: a namespace and, from stack.Start, the
// kubelet stand-in, csi-attacher (trivial, or the real one against the
// mock driver) and a (restartable) controller.
type env struct {
	t      *testing.T
	ctx    context.Context
	client kubernetes.Interface
	ns     string
	driver string
	prefix string

	stack   *stack.Stack
	kubelet *localcluster.Kubelet // nil in a real-kubelet env
	nodes   []string
	// real is the real-kubelet env's part (nil with the stand-in).
	real *realKubelet
	// wait bounds each eventually.
	wait time.Duration

	cfg      controller.Config
	registry metrics.KubeRegistry
	// ctrlAPI records the API writes of every controller the test
	// starts (restarts included).
	ctrlAPI *testsupport.APITransport
	// createsBase is the count of VolumeAttachment creates at the last
	// resetCreates.
	createsBase int
	stopCtrl    func()
	// ctrlWrap, when set, wraps the controller's API transport outermost
	// (fault injection).
	ctrlWrap func(http.RoundTripper) http.RoundTripper
}

// envOptions says how newEnvWith makes a test's env.
type envOptions struct {
	// cfg is the controller's configuration.
	cfg controller.Config
	// mockDriver runs the real csi-attacher (RunSidecar, the code the
	// binary runs) against the mock CSI driver over a unix socket,
	// retrying failed attaches quickly, instead of the trivial attacher;
	// the driver can be told to fail. driverConfig adjusts the driver.
	mockDriver   bool
	driverConfig func(*csimock.Config)
	// driver overrides the test-unique driver name.
	driver string
	// noController: the test starts the controller (startController) or
	// runs its own.
	noController bool
	// ctrlWrap: see env.
	ctrlWrap func(http.RoundTripper) http.RoundTripper
	// realKubelet runs no kubelet stand-in: addNode starts a hollow
	// kubelet (the real kubelet, hollow.go) per node, with the mock
	// driver's node endpoint for it, and the real csi-attacher in-process
	// against the mock driver (mockDriver is implied).
	realKubelet bool
}

func newEnv(t *testing.T, cfg controller.Config) *env {
	t.Helper()
	return newEnvWith(t, envOptions{cfg: cfg})
}

// newEnvWithoutController is newEnv for tests that run the controller
// their own way.
func newEnvWithoutController(t *testing.T, cfg controller.Config) *env {
	t.Helper()
	return newEnvWith(t, envOptions{cfg: cfg, noController: true})
}

// newEnvWith makes the namespace and starts the stack as w says.
func newEnvWith(t *testing.T, w envOptions) *env {
	t.Helper()
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), klog.Background()))
	t.Cleanup(cancel)
	client := cluster.Client()
	names := envNames.New(t, ctx, client, w.driver)
	e := &env{
		t: t, ctx: ctx, client: client,
		prefix: names.Prefix, ns: names.Namespace, driver: names.Driver,
		cfg:      w.cfg,
		ctrlAPI:  testsupport.NewAPITransport(),
		ctrlWrap: w.ctrlWrap,
		wait:     timeout,
	}
	mode := stack.AttacherTrivial
	if w.mockDriver || w.realKubelet {
		mode = stack.AttacherInProcess
	}
	s, err := stack.Start(ctx, stack.Options{
		Cluster: cluster, Driver: e.driver, Attacher: mode, Mock: w.driverConfig,
		NoKubelet: w.realKubelet,
		// The binary's configuration, with retries fast enough for the
		// suite's timeouts.
		AttacherConfig: func(_ int, cfg *attacher.SidecarConfig) {
			stack.QuickAttacher(cfg)
			cfg.Controller.Workers = 4
			cfg.Controller.RetryIntervalMax = 500 * time.Millisecond
			cfg.Controller.ReconcileSync = 0 // the suite's tests read no ListVolumes reconcile
		},
		NoController: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	e.stack, e.kubelet = s, s.Kubelet
	t.Cleanup(e.cleanup)
	if w.realKubelet {
		e.startRealKubelet()
	}
	if !w.noController {
		e.startController()
	}
	return e
}

// stopKubelet stops the kubelet stand-in: the nodes stay, no longer
// updated.
func (e *env) stopKubelet() {
	if err := e.stack.StopKubelet(); err != nil {
		e.t.Errorf("kubelet stand-in: %v", err)
	}
}

// startController starts a controller (the binary's Serve) with its own
// informers and client. The client's writes are recorded in e.ctrlAPI.
func (e *env) startController() {
	e.t.Helper()
	c := e.stack.StartController(e.ctx, func(cfg *controller.ServeConfig) {
		cfg.RESTConfig.QPS, cfg.RESTConfig.Burst = 1000, 2000
		cfg.RESTConfig.Wrap(e.ctrlAPI.Wrap)
		if e.ctrlWrap != nil {
			cfg.RESTConfig.Wrap(e.ctrlWrap)
		}
		cfg.Controller = e.cfg
		e.registry = metrics.NewKubeRegistry()
		cfg.Registry = e.registry
	})
	e.stopCtrl = func() {
		if err := c.Stop(); err != nil {
			e.t.Errorf("controller: %v", err)
		} else if err := c.Result(); err != nil {
			e.t.Errorf("controller Serve: %v", err)
		}
	}
}

// stopController stops the controller.
func (e *env) stopController() {
	if e.stopCtrl != nil {
		e.stopCtrl()
		e.stopCtrl = nil
	}
}

// cleanup stops the controller and removes what the test made that a
// later test's controller would otherwise act on.
func (e *env) cleanup() {
	e.checkEveryDetachChecked()
	e.stopController()
	if n := e.refusedCreates(); n > 0 {
		e.t.Errorf("%d VolumeAttachment creates of the controller were answered AlreadyExists", n)
	}
	if err := e.stack.Stop(); err != nil {
		e.t.Errorf("stack: %v", err)
	}
	ctx := context.WithoutCancel(e.ctx)
	pods, _ := e.client.CoreV1().Pods(e.ns).List(ctx, metav1.ListOptions{})
	for _, p := range pods.Items {
		_ = e.client.CoreV1().Pods(e.ns).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	}
	for _, n := range e.nodes {
		if e.kubelet != nil {
			_ = e.kubelet.DeleteNode(ctx, n)
			continue
		}
		_ = e.client.CoreV1().Nodes().Delete(ctx, n, metav1.DeleteOptions{})
		_ = e.client.StorageV1().CSINodes().Delete(ctx, n, metav1.DeleteOptions{})
	}
	vas, _ := e.client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	for _, va := range vas.Items {
		if va.Spec.Attacher == e.driver {
			_ = e.client.StorageV1().VolumeAttachments().Delete(ctx, va.Name, metav1.DeleteOptions{})
		}
	}
}

// isVACreate reports whether w is a VolumeAttachment create.
func isVACreate(w testsupport.Write) bool {
	return w.Method == http.MethodPost && w.Resource == "volumeattachments" && w.Subresource == "" && w.Name == ""
}

// createCount is how many VolumeAttachments the controllers created since
// the last resetCreates (a create answered AlreadyExists made nothing).
func (e *env) createCount() int {
	n := 0
	for _, w := range e.ctrlAPI.Writes() {
		if isVACreate(w) && w.Err == nil && w.Code < 300 {
			n++
		}
	}
	return n - e.createsBase
}

// resetCreates starts createCount from zero.
func (e *env) resetCreates() { e.createsBase += e.createCount() }

// refusedCreates counts the controllers' VolumeAttachment creates answered
// AlreadyExists: a create for an object the controller had made itself
// (or should have known of) is a wasted write, and the test fails on any.
func (e *env) refusedCreates() int {
	n := 0
	for _, w := range e.ctrlAPI.Writes() {
		if isVACreate(w) && w.Code == http.StatusConflict {
			n++
		}
	}
	return n
}
