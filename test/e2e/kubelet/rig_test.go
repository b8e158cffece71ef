package kubelet_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/latchcsi/latch/internal/attachdetach/controller"
	"github.com/latchcsi/latch/internal/attacher"
	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/kube/kubenames"
	"github.com/latchcsi/latch/internal/localcluster"
	"github.com/latchcsi/latch/internal/stack"
	"github.com/latchcsi/latch/internal/testsupport"
)

const testDriver = "mock.csi.latch.dev"

// rig is one test's world: the stack (mock driver, csi-attacher,
// attach/detach controller, no kubelet stand-in) against the package's
// control plane, a namespace, the API history of that namespace's Pods
// and of every Node and VolumeAttachment, and the hollow nodes the test
// adds.
type rig struct {
	t      *testing.T
	ctx    context.Context
	s      *stack.Stack
	client kubernetes.Interface
	hist   *history
	ns     string
	// prefix makes names unique per test: the package's tests share one
	// control plane.
	prefix string
	nodes  map[string]*node
}

// node is a hollow node of the rig.
type node struct {
	*stack.HollowNode
	id  string
	log *testsupport.SyncBuffer
}

type rigOptions struct {
	// Mock adjusts the mock driver (fault rules, say).
	Mock func(*csimock.Config)
	// Controller adjusts the attach/detach controller.
	Controller func(*controller.ServeConfig)
	// ControlPlane runs the real kube-scheduler and kube-controller-manager
	// (every controller but attachdetach), their logs shown when the test
	// fails: kcm's PV controller completes the bindings of preboundVolume
	// (the scheduler's VolumeBinding plugin waits for its
	// pv.kubernetes.io/bind-completed), its root-ca publisher lets the
	// kubelet mount the Pods' service-account tokens, its serviceaccount
	// controller makes the namespace's ServiceAccount. The rig's Pods are
	// then created without spec.nodeName by unscheduledPod.
	ControlPlane bool
}

func newRig(t *testing.T, timeout time.Duration, o rigOptions) *rig {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	opts := stack.Options{
		Cluster:          cluster,
		Driver:           testDriver,
		NoKubelet:        true,
		Mock:             o.Mock,
		AttacherConfig:   func(_ int, c *attacher.SidecarConfig) { stack.QuickAttacher(c) },
		ControllerConfig: o.Controller,
	}
	var cpLog *testsupport.SyncBuffer
	if o.ControlPlane {
		cpLog = &testsupport.SyncBuffer{}
		opts.Scheduler, opts.ControllerManager, opts.ControlPlaneOutput = true, true, cpLog
	}
	s, err := stack.Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Error(err)
		}
		if cpLog != nil && t.Failed() {
			t.Logf("kube-scheduler and kube-controller-manager log (tail):\n%s", tail(cpLog.String(), 200))
		}
	})
	r := &rig{t: t, ctx: ctx, s: s, client: s.Client, nodes: map[string]*node{}}
	r.prefix = "k" + strconv.Itoa(int(runSeq.Add(1)))
	r.ns = "kubelet-e2e-" + r.prefix
	if _, err := r.client.StorageV1().CSIDrivers().Create(ctx, localcluster.NewCSIDriver(testDriver, new(true)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = r.client.StorageV1().CSIDrivers().Delete(context.Background(), testDriver, metav1.DeleteOptions{})
	})
	if o.ControlPlane {
		// No ServiceAccount by hand: kcm's serviceaccount controller makes it.
		_, err = r.client.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: r.ns}}, metav1.CreateOptions{})
	} else {
		err = localcluster.CreateNamespace(ctx, r.client, r.ns)
	}
	if err != nil {
		t.Fatal(err)
	}
	r.hist = recordHistory(t, ctx, r.client, r.ns)
	return r
}

// dumpCalls logs the mock driver's call log (for a failure's context).
func (r *rig) dumpCalls() { r.t.Logf("mock driver calls:\n%s", callTable(r.s.Driver.Calls())) }

// addNode starts a hollow node named prefix-name (its own root dir and
// loopback port, no healthz port) and waits until it is Ready with the
// driver registered in its CSINode under NodeGetInfo's node ID.
func (r *rig) addNode(name string, maxVolumes int64) *node {
	t := r.t
	t.Helper()
	name = r.prefix + "-" + name
	// Short: unix socket paths under it are limited to 107 bytes.
	root, err := os.MkdirTemp("", "hk")
	if err != nil {
		t.Fatal(err)
	}
	n := &node{id: stack.NodeID(name), log: &testsupport.SyncBuffer{}}
	n.HollowNode, err = r.s.StartHollowNode(r.ctx, stack.HollowOptions{Name: name, RootDir: root, Output: n.log, MaxVolumes: maxVolumes})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		testsupport.StopHollowKubelet(t, name, n, n.log, 120)
		_ = os.RemoveAll(root)
		deleteNode(t, r.client, name)
	})
	r.nodes[name] = n
	r.waitRegistered(n)
	return n
}

// waitRegistered waits for n's Node to be Ready and its CSINode to list
// the driver with n's node ID.
func (r *rig) waitRegistered(n *node) {
	t := r.t
	t.Helper()
	testsupport.Eventually(t, r.ctx, 90*time.Second, "the kubelet registers Node "+n.Name+" Ready and the driver in its CSINode", func(ctx context.Context) (bool, error) {
		no, err := r.client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil || !kube.NodeReady(no) {
			return false, err
		}
		d, err := r.csiNodeDriver(ctx, n.Name)
		if err != nil || d == nil {
			return false, err
		}
		if d.NodeID != n.id {
			t.Fatalf("CSINode %s lists %s with node ID %q, want %q (NodeGetInfo's)", n.Name, testDriver, d.NodeID, n.id)
		}
		return true, nil
	}, r.dumpCalls)
}

// csiNodeDriver is the driver's entry in node's CSINode (nil: none yet).
func (r *rig) csiNodeDriver(ctx context.Context, node string) (*storagev1.CSINodeDriver, error) {
	cn, err := r.client.StorageV1().CSINodes().Get(ctx, node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	for i := range cn.Spec.Drivers {
		if cn.Spec.Drivers[i].Name == testDriver {
			return &cn.Spec.Drivers[i], nil
		}
	}
	return nil, nil
}

// volume creates a bound RWO CSI PV and PVC named prefix-name; the name
// is the volume handle too.
func (r *rig) volume(name string) string {
	r.t.Helper()
	name = r.prefix + "-" + name
	if _, _, err := localcluster.CreateBoundVolume(r.ctx, r.client, localcluster.VolumeSpec{Namespace: r.ns, Name: name, Driver: testDriver}); err != nil {
		r.t.Fatal(err)
	}
	return name
}

// pod creates Pod name on n (spec.nodeName set: no scheduler runs)
// mounting the PVCs of vols.
func (r *rig) pod(name string, n *node, vols ...string) {
	r.t.Helper()
	p := localcluster.NewPod(r.ns, name, n.Name, vols...)
	p.Spec.AutomountServiceAccountToken = new(false) // no root-ca publisher runs
	if _, err := r.client.CoreV1().Pods(r.ns).Create(r.ctx, p, metav1.CreateOptions{}); err != nil {
		r.t.Fatal(err)
	}
}

func (r *rig) getPod(ctx context.Context, name string) (*v1.Pod, bool, error) {
	p, err := r.client.CoreV1().Pods(r.ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, false, nil
	}
	return p, err == nil, err
}

func (r *rig) waitPodRunning(name string, timeout time.Duration) {
	r.t.Helper()
	testsupport.Eventually(r.t, r.ctx, timeout, "Pod "+name+" Running", func(ctx context.Context) (bool, error) {
		p, ok, err := r.getPod(ctx, name)
		return ok && p.Status.Phase == v1.PodRunning, err
	}, r.dumpCalls)
}

func (r *rig) deletePod(name string) {
	r.t.Helper()
	if err := r.client.CoreV1().Pods(r.ns).Delete(r.ctx, name, metav1.DeleteOptions{}); err != nil {
		r.t.Fatal(err)
	}
}

func (r *rig) waitPodGone(name string, timeout time.Duration) {
	r.t.Helper()
	testsupport.Eventually(r.t, r.ctx, timeout, "Pod "+name+" gone", func(ctx context.Context) (bool, error) {
		_, ok, err := r.getPod(ctx, name)
		return !ok && err == nil, err
	}, r.dumpCalls)
}

func (r *rig) vaName(vol string, n *node) string {
	return kubenames.VolumeAttachmentName(vol, testDriver, n.Name)
}

func (r *rig) getVA(ctx context.Context, vol string, n *node) (*storagev1.VolumeAttachment, bool, error) {
	va, err := r.client.StorageV1().VolumeAttachments().Get(ctx, r.vaName(vol, n), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, false, nil
	}
	return va, err == nil, err
}

// waitDetached waits until vol's VolumeAttachment to n is gone after a
// successful ControllerUnpublish.
func (r *rig) waitDetached(vol string, n *node, timeout time.Duration) {
	r.t.Helper()
	testsupport.Eventually(r.t, r.ctx, timeout, "volume "+vol+" detached from "+n.Name, func(ctx context.Context) (bool, error) {
		if _, ok, err := r.getVA(ctx, vol, n); ok || err != nil {
			return false, err
		}
		_, ok := findNodeCall(r.s.Driver.Calls(), "ControllerUnpublishVolume", vol, n.id, codes.OK)
		return ok, nil
	}, r.dumpCalls)
}

// consistently fails the test if check reports a violation (a
// non-empty description) within d.
func (r *rig) consistently(what string, d time.Duration, check func(ctx context.Context) (string, error)) {
	r.t.Helper()
	testsupport.Consistently(r.t, r.ctx, d, what, func(ctx context.Context) (bool, error) {
		violation, err := check(ctx)
		if err == nil && violation != "" {
			err = errors.New(violation)
		}
		return err == nil, err
	}, r.dumpCalls)
}
