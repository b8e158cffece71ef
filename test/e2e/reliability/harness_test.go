// Package reliability_test proves latch's promises under faults: nothing is
// lost, leaked or attached to two nodes at once, whatever crashes. Every
// test runs both controllers (the attach/detach controller and csi-attacher
// with the mock CSI driver over a real unix socket) on the in-process
// kube-apiserver with the kubelet stand-in, injects faults, and then checks
// the invariants in invariants_test.go.
//
// Tests run one after the other; each has its own namespace, driver name,
// nodes and controllers, and removes what it made before the next starts.
package reliability_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/attachdetach/controller"
	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/localcluster"
	"github.com/latchcsi/latch/internal/stack"
	"github.com/latchcsi/latch/internal/testsupport"
)

var cluster *localcluster.Cluster

func TestMain(m *testing.M) { stack.RunTestMain(m, &cluster) }

// worlds names each test's namespace and driver rl<n>.
var worlds = stack.Worlds{Prefix: "rl"}

// options shape one test's world.
type options struct {
	// replicas of csi-attacher; more than one turns leader election on.
	replicas int
	// secret, when set, is the controller-publish secret every volume of
	// the test references (created in the test's namespace).
	secret map[string][]byte
	// logger for both controllers; klog.Background() when nil.
	logger *klog.Logger
	// ctrl is the attach/detach controller's configuration.
	ctrl controller.Config
	// noController leaves the attach/detach controller out, for tests that
	// write VolumeAttachments themselves.
	noController bool
	// driver overrides the driver name.
	driver string
	// noAttacher starts no in-process csi-attacher, for tests that run
	// the real binary against the env's driver socket.
	noAttacher bool
}

// env is one test's world: a namespace, a mock driver, a kubelet stand-in,
// supervised csi-attacher replicas and a killable attach/detach controller.
type env struct {
	t      *testing.T
	ctx    context.Context
	client kubernetes.Interface
	opts   options
	ns     string
	driver string
	prefix string
	socket string

	stack   *stack.Stack
	mock    *csimock.Driver
	kubelet *localcluster.Kubelet
	nodes   []string

	// disruptions are the times the test broke something outside the
	// driver's own fault rules (API server restart, controller kill, driver
	// crash): a publish repeated after one of them is a legitimate retry
	// of an outcome the controllers could not know.
	disruptMu   sync.Mutex
	disruptions []disruption

	attachers []*replica
	ctrl      *adController
	// killedAttachers counts killAttacher calls (for fresh identities).
	killedAttachers int
	// apiWrites holds every controller's API transport, to find the
	// writes the API server rejected as invalid (invariant 6).
	apiWrites writeLog
	// repeats counts, by disruption, the repeated successful publishes
	// the last history check accepted because of it.
	repeats map[string]int
	// claims records which VolumeAttachment claimed which publication
	// when (invariant 8).
	claims *claimLog
}

type disruption struct {
	what       string
	start, end time.Time
}

func newEnv(t *testing.T, o options) *env {
	t.Helper()
	if o.replicas == 0 {
		o.replicas = 1
	}
	if o.ctrl.Workers == 0 {
		o.ctrl.Workers = 8
	}
	logger := klog.Background()
	if o.logger != nil {
		logger = *o.logger
	}
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	t.Cleanup(cancel)
	client := cluster.Client()
	names := worlds.New(t, ctx, client, o.driver)
	e := &env{
		t: t, ctx: ctx, client: client, opts: o,
		prefix: names.Prefix, ns: names.Namespace, driver: names.Driver,
	}
	if o.secret != nil {
		s := &v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "publish-secret"}, Data: o.secret}
		// The test's own write of the Secret is not under test: keep its
		// request and response bodies out of a test's -v=10 log capture.
		quiet := klog.NewContext(ctx, logr.Discard())
		if _, err := e.client.CoreV1().Secrets(e.ns).Create(quiet, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// csi-attacher replicas are supervised (restarted when RunSidecar
	// returns) and started below, each with its own identity and API
	// transport; so is the (killable) controller.
	s, err := stack.Start(ctx, stack.Options{
		Cluster: cluster, Driver: e.driver, KubeletWorkers: 4,
		// The driver lets a single-node volume onto a second node and
		// records it, so the invariant checks see what the controllers
		// asked for rather than what the driver refused.
		Mock:     func(cfg *csimock.Config) { cfg.SkipSingleNodeCheck = true },
		Attacher: stack.AttacherOnDemand, RestartAttachers: true,
		NoController: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	e.stack, e.mock, e.kubelet, e.socket = s, s.Driver, s.Kubelet, s.Socket
	e.claims = startClaimLog(ctx, client, e.driver)
	// Cleanup runs last-registered first: e.cleanup tears down the world
	// (the stack included) with the controllers still running.
	t.Cleanup(e.cleanup)

	for i := range o.replicas {
		if o.noAttacher {
			break
		}
		e.attachers = append(e.attachers, e.startAttacher(fmt.Sprintf("%s-attacher-%d", e.prefix, i)))
	}
	if !o.noController {
		e.startController()
	}
	return e
}

// disrupt records that something outside the driver's fault rules broke
// from now until the returned func is called.
func (e *env) disrupt(what string) (end func()) {
	e.disruptMu.Lock()
	defer e.disruptMu.Unlock()
	i := len(e.disruptions)
	e.disruptions = append(e.disruptions, disruption{what: what, start: time.Now()})
	return func() {
		e.disruptMu.Lock()
		e.disruptions[i].end = time.Now()
		e.disruptMu.Unlock()
	}
}

// disrupted records a disruption that is over at once (a kill).
func (e *env) disrupted(what string) { e.disrupt(what)() }

// disruptionGrace is how long after a disruption the controllers may still
// be catching up on what it hid (a status write retried with backoff, an
// informer relisting).
const disruptionGrace = 3 * time.Second

// disruptedBetween returns the disruption that overlapped [from, to], ""
// when none did.
func (e *env) disruptedBetween(from, to time.Time) string {
	e.disruptMu.Lock()
	defer e.disruptMu.Unlock()
	for _, d := range e.disruptions {
		end := d.end
		if end.IsZero() {
			end = time.Now()
		}
		if !d.start.After(to) && !end.Add(disruptionGrace).Before(from) {
			return d.what
		}
	}
	return ""
}

// --- attach/detach controller ---

type adController struct {
	api *testsupport.APITransport
	c   *stack.Component
}

// kill is a SIGKILL stand-in: the process's network dies first (no
// request of the dying process reaches the API server afterwards, nothing
// is released or flushed), then its goroutines are told to stop. Nothing
// is awaited.
func (c *adController) kill() {
	c.api.Partition()
	c.c.Kill()
}

// startController starts an attach/detach controller (the binary's Serve)
// with its own client, API transport and informers.
func (e *env) startController() {
	e.t.Helper()
	c := &adController{api: testsupport.NewAPITransport()}
	e.apiWrites.add("attachdetach-controller", c.api)
	c.c = e.stack.StartController(e.ctx, func(cfg *controller.ServeConfig) {
		cfg.RESTConfig.QPS, cfg.RESTConfig.Burst = 1000, 2000
		cfg.RESTConfig.Wrap(c.api.Wrap)
		cfg.Controller = e.opts.ctrl
	})
	e.ctrl = c
}

// killController kills the controller abruptly and starts a new one.
func (e *env) killController() {
	e.disrupted("attach/detach controller killed")
	e.ctrl.kill()
	e.startController()
}

// cleanup deletes the test's Pods while both controllers still run, so
// every VolumeAttachment is detached through the driver, then stops them.
// A test that already checked teardownClean finds nothing left here.
func (e *env) cleanup() {
	ctx := context.WithoutCancel(e.ctx)
	e.mock.ClearFaults()
	_ = e.mock.Restart() // in case a test left it crashed
	for _, n := range e.nodes {
		_ = e.kubelet.SetReady(ctx, n, true)
	}
	pods, _ := e.client.CoreV1().Pods(e.ns).List(ctx, metav1.ListOptions{})
	for _, p := range pods.Items {
		_ = e.client.CoreV1().Pods(e.ns).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	}
	_ = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return len(e.vas()) == 0, nil
	})
	// Stops every controller and replica (a killed one's end is no
	// error), the kubelet stand-in and the driver.
	if err := e.stack.Stop(); err != nil {
		e.t.Errorf("stopping the controllers: %v", err)
	}
	for _, n := range e.nodes {
		_ = e.kubelet.DeleteNode(ctx, n)
	}
	// Anything still there belongs to no running controller: strip our
	// finalizers so the next test starts from a clean API server.
	for _, va := range e.vas() {
		_ = e.client.StorageV1().VolumeAttachments().Delete(ctx, va.Name, metav1.DeleteOptions{})
		if len(va.Finalizers) > 0 {
			patch := []byte(`{"metadata":{"finalizers":null}}`)
			_, _ = e.client.StorageV1().VolumeAttachments().Patch(ctx, va.Name, "application/merge-patch+json", patch, metav1.PatchOptions{})
		}
	}
}
