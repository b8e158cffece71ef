// Package attachdetach_test runs the attach/detach controller end to end
// on the in-process kube-apiserver, with the kubelet stand-in and
// csi-attacher in trivial mode (it marks every VolumeAttachment of its
// driver attached). Tests run one after the other, each with its own
// controller, driver, namespace and nodes; each cleans up what it made so
// the next test's controller does not act on it.
package attachdetach_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/component-base/metrics"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/attachdetach/controller"
	"github.com/latchcsi/latch/internal/attacher"
	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/localcluster"
	"github.com/latchcsi/latch/internal/stack"
	"github.com/latchcsi/latch/internal/testsupport"
)

var cluster *localcluster.Cluster

func TestMain(m *testing.M) { stack.RunTestMain(m, &cluster) }

var testSeq atomic.Int32

// env is one test's world: a namespace and, from stack.Start, the
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
	kubelet *localcluster.Kubelet
	nodes   []string

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

// world says how newWorld makes a test's world.
type world struct {
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
}

func newEnv(t *testing.T, cfg controller.Config) *env {
	t.Helper()
	return newWorld(t, world{cfg: cfg})
}

// newEnvWithoutController is newEnv for tests that run the controller
// their own way.
func newEnvWithoutController(t *testing.T, cfg controller.Config) *env {
	t.Helper()
	return newWorld(t, world{cfg: cfg, noController: true})
}

// newEnvWithMockDriver is newEnv with the real csi-attacher against the
// mock CSI driver (world.mockDriver).
func newEnvWithMockDriver(t *testing.T, cfg controller.Config) (*env, *csimock.Driver) {
	t.Helper()
	e := newWorld(t, world{cfg: cfg, mockDriver: true})
	return e, e.stack.Driver
}

// newWorld makes the namespace and starts the stack as w says.
func newWorld(t *testing.T, w world) *env {
	t.Helper()
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), klog.Background()))
	t.Cleanup(cancel)
	n := testSeq.Add(1)
	e := &env{
		t: t, ctx: ctx, client: cluster.Client(),
		prefix:   fmt.Sprintf("ad%d", n),
		cfg:      w.cfg,
		ctrlAPI:  testsupport.NewAPITransport(),
		ctrlWrap: w.ctrlWrap,
	}
	e.ns = e.prefix + "-ns"
	e.driver = e.prefix + ".csi.latch.test"
	if w.driver != "" {
		e.driver = w.driver
	}
	if err := localcluster.CreateNamespace(ctx, e.client, e.ns); err != nil {
		t.Fatal(err)
	}
	mode := stack.AttacherTrivial
	if w.mockDriver {
		mode = stack.AttacherInProcess
	}
	s, err := stack.Start(ctx, stack.Options{
		Cluster: cluster, Driver: e.driver, Attacher: mode, Mock: w.driverConfig,
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
		_ = e.kubelet.DeleteNode(ctx, n)
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

// --- objects ---

func (e *env) addNode(suffix string) string {
	e.t.Helper()
	name := e.prefix + "-" + suffix
	if err := e.kubelet.AddNode(e.ctx, localcluster.NodeConfig{Name: name, Drivers: map[string]string{e.driver: name + "-id"}}); err != nil {
		e.t.Fatal(err)
	}
	e.nodes = append(e.nodes, name)
	return name
}

// volume creates a bound PV+PVC of the test's driver; returns the PV name
// (= PVC name = volume handle).
func (e *env) volume(suffix string, modes ...v1.PersistentVolumeAccessMode) string {
	e.t.Helper()
	name := e.prefix + "-" + suffix
	return e.volumeOf(e.driver, name, modes...)
}

func (e *env) volumeOf(driver, name string, modes ...v1.PersistentVolumeAccessMode) string {
	e.t.Helper()
	if _, _, err := localcluster.CreateBoundVolume(e.ctx, e.client, localcluster.VolumeSpec{
		Namespace: e.ns, Name: name, Driver: driver, AccessModes: modes,
	}); err != nil {
		e.t.Fatal(err)
	}
	return name
}

func (e *env) pod(name, node string, claims ...string) *v1.Pod {
	e.t.Helper()
	pod, err := e.client.CoreV1().Pods(e.ns).Create(e.ctx, localcluster.NewPod(e.ns, name, node, claims...), metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return pod
}

func (e *env) deletePod(name string) {
	e.t.Helper()
	if err := e.client.CoreV1().Pods(e.ns).Delete(e.ctx, name, metav1.DeleteOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) unique(pv string) v1.UniqueVolumeName { return kube.UniqueVolumeName(e.driver, pv) }

func (e *env) vaName(pv, node string) string { return kube.VolumeAttachmentName(pv, e.driver, node) }

// --- polling ---

const timeout = 30 * time.Second

func (e *env) eventually(what string, cond func() (bool, error)) {
	e.t.Helper()
	testsupport.Eventually(e.t, e.ctx, timeout, what, func(context.Context) (bool, error) { return cond() })
}

// consistently fails if cond turns false within d.
func (e *env) consistently(what string, d time.Duration, cond func() (bool, error)) {
	e.t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		ok, err := cond()
		if err != nil || !ok {
			e.t.Fatalf("%s stopped holding: %v", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (e *env) getVA(name string) (*storagev1.VolumeAttachment, bool) {
	va, err := e.client.StorageV1().VolumeAttachments().Get(e.ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, false
	}
	if err != nil {
		e.t.Fatalf("get VolumeAttachment %s: %v", name, err)
	}
	return va, true
}

func (e *env) waitAttachedVA(pv, node string) *storagev1.VolumeAttachment {
	e.t.Helper()
	var va *storagev1.VolumeAttachment
	e.eventually("VolumeAttachment of "+pv+" on "+node+" attached", func() (bool, error) {
		v, ok := e.getVA(e.vaName(pv, node))
		va = v
		return ok && v.Status.Attached, nil
	})
	return va
}

// runningPod starts Pod "app" on a new node n1 with a new ReadWriteOnce
// volume (suffix) and waits until the volume is attached and the Pod runs.
func (e *env) runningPod(suffix string) (node, pv string, va *storagev1.VolumeAttachment) {
	e.t.Helper()
	node = e.addNode("n1")
	pv = e.volume(suffix, rwo())
	e.pod("app", node, pv)
	va = e.waitAttachedVA(pv, node)
	e.waitPodRunning("app")
	return node, pv, va
}

// createVA creates a VolumeAttachment of the test's driver for pv on node
// as another client would (no Pod asked for it).
func (e *env) createVA(pv, node string) {
	e.t.Helper()
	va := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: e.vaName(pv, node)},
		Spec: storagev1.VolumeAttachmentSpec{Attacher: e.driver, NodeName: node,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv}},
	}
	if _, err := e.client.StorageV1().VolumeAttachments().Create(e.ctx, va, metav1.CreateOptions{}); err != nil {
		e.t.Fatalf("create VolumeAttachment of %s on %s: %v", pv, node, err)
	}
}

func (e *env) waitVAGone(pv, node string) {
	e.t.Helper()
	e.eventually("VolumeAttachment of "+pv+" on "+node+" deleted", func() (bool, error) {
		_, ok := e.getVA(e.vaName(pv, node))
		return !ok, nil
	})
}

func (e *env) node(name string) *v1.Node {
	n, err := e.client.CoreV1().Nodes().Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatalf("get node %s: %v", name, err)
	}
	return n
}

func attachedNames(n *v1.Node) []v1.UniqueVolumeName {
	var out []v1.UniqueVolumeName
	for _, av := range n.Status.VolumesAttached {
		out = append(out, av.Name)
	}
	return out
}

// waitNodeAttached waits until node's status.volumesAttached is exactly want.
func (e *env) waitNodeAttached(node string, want ...v1.UniqueVolumeName) {
	e.t.Helper()
	e.eventually(fmt.Sprintf("node %s volumesAttached = %v", node, want), func() (bool, error) {
		got := attachedNames(e.node(node))
		if len(got) != len(want) {
			return false, nil
		}
		for i := range got {
			if got[i] != want[i] {
				return false, nil
			}
		}
		return true, nil
	})
}

func (e *env) waitPodRunning(name string) {
	e.t.Helper()
	e.eventually("pod "+name+" running", func() (bool, error) {
		p, err := e.client.CoreV1().Pods(e.ns).Get(e.ctx, name, metav1.GetOptions{})
		return err == nil && p.Status.Phase == v1.PodRunning, nil
	})
}

func (e *env) waitPodGone(name string) {
	e.t.Helper()
	e.eventually("pod "+name+" gone", func() (bool, error) {
		_, err := e.client.CoreV1().Pods(e.ns).Get(e.ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
}

// events returns the controller's events on the pod with reason.
func (e *env) events(pod, reason string) []v1.Event {
	e.t.Helper()
	list, err := e.client.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{FieldSelector: fields.Set{
		"involvedObject.name": pod, "reason": reason, "source": controller.EventComponent,
	}.AsSelector().String()})
	if err != nil {
		e.t.Fatalf("list events: %v", err)
	}
	return list.Items
}

func (e *env) waitEvent(pod, reason, message string) {
	e.t.Helper()
	e.eventually(fmt.Sprintf("event %s %q on pod %s", reason, message, pod), func() (bool, error) {
		for _, ev := range e.events(pod, reason) {
			if ev.Message == message {
				return true, nil
			}
		}
		return false, nil
	})
}

// controllerWrites returns the controller's successful API writes so far.
// waitControllerWrites waits until the controller's API writes are
// exactly want, in order, and fails at once on a write that is not. A
// write is recorded when its response arrives, which can be a moment
// after the test saw its effect.
func (e *env) waitControllerWrites(want []string) {
	e.t.Helper()
	e.eventually(fmt.Sprintf("controller API writes %q", want), func() (bool, error) {
		got := e.controllerWrites()
		if len(got) > len(want) || !slices.Equal(got, want[:len(got)]) {
			return false, fmt.Errorf("controller API writes:\n got %q\nwant %q", got, want)
		}
		return len(got) == len(want), nil
	})
}

func (e *env) controllerWrites() []string {
	var out []string
	for _, w := range e.ctrlAPI.Writes() {
		if w.Resource != "events" && w.Err == nil && w.Code < 300 {
			out = append(out, w.Method+" "+w.Path)
		}
	}
	return out
}
