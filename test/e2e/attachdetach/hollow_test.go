package attachdetach_test

// The real-kubelet env (envOptions.realKubelet): one hollow kubelet per node
// (stack.StartHollowNode: Kubernetes v1.37.2's kubelet with kubemark's
// fake runtime and mounter) with the mock driver's node endpoint for it,
// the real csi-attacher against the mock driver, and an API history from
// which every attach and every detach of the test is checked against the
// kubelet ordering contract (kubeletorder).

import (
	"fmt"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/latchcsi/latch/internal/attachdetach/controller"
	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/stack"
	"github.com/latchcsi/latch/internal/testsupport"
	"github.com/latchcsi/latch/internal/testsupport/kubeletorder"
)

// realKubelet is a real-kubelet env's part of env.
type realKubelet struct {
	hist  *kubeletorder.History
	order *kubeletorder.Checker
	nodes map[string]*stack.HollowNode
	// checked are the (volume, node ID) pairs whose detach was checked.
	checked map[[2]string]bool
}

// newRealKubeletEnv is newEnv in a real-kubelet env.
func newRealKubeletEnv(t *testing.T, cfg controller.Config) *env {
	t.Helper()
	return newEnvWith(t, envOptions{cfg: cfg, realKubelet: true})
}

// startRealKubelet records the API history from before the test's
// first object.
func (e *env) startRealKubelet() {
	e.wait = realTimeout
	hist := kubeletorder.Record(e.t, e.ctx, e.client, e.ns)
	e.real = &realKubelet{
		hist:    hist,
		order:   &kubeletorder.Checker{Driver: e.stack.Driver, DriverName: e.driver, History: hist},
		nodes:   map[string]*stack.HollowNode{},
		checked: map[[2]string]bool{},
	}
}

// nodeID is the CSI node ID of node: NodeGetInfo's on a hollow node, the
// stand-in's CSINode entry otherwise.
func (e *env) nodeID(node string) string {
	if e.real != nil {
		return stack.NodeID(node)
	}
	return node + "-id"
}

// addHollowNode starts a hollow node (its root directory short: unix
// socket paths under it are limited to 107 bytes) and waits until its
// kubelet has registered the Node Ready and the driver in its CSINode
// with NodeGetInfo's node ID. The kubelet stops when the test ends, its
// log shown when the test failed.
func (e *env) addHollowNode(name string) string {
	e.t.Helper()
	return e.addHollowNodeWith(name)
}

// addHollowNodeWith is addHollowNode for a node that also runs the node
// plugins of the mock drivers extra (HollowOptions.ExtraDrivers): it
// waits until the CSINode lists each of them too.
func (e *env) addHollowNodeWith(name string, extra ...*csimock.Driver) string {
	t := e.t
	t.Helper()
	log := &testsupport.SyncBuffer{}
	h, err := e.stack.StartHollowNode(e.ctx, stack.HollowOptions{Name: name, RootDir: testsupport.SocketDir(t), Output: log, ExtraDrivers: extra})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { testsupport.StopHollowKubelet(t, name, h, log, 80) })
	e.nodes = append(e.nodes, name)
	e.real.nodes[name] = h
	want := []string{e.driver}
	for _, d := range extra {
		want = append(want, d.Config().Name)
	}
	e.eventually(fmt.Sprintf("the kubelet registers Node %s Ready and the drivers %q in its CSINode", name, want), func() (bool, error) {
		no, err := e.client.CoreV1().Nodes().Get(e.ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || err == nil && !kube.NodeReady(no) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		cn, err := e.client.StorageV1().CSINodes().Get(e.ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		listed := 0
		for _, d := range cn.Spec.Drivers {
			if !slices.Contains(want, d.Name) {
				continue
			}
			if d.NodeID != e.nodeID(name) {
				t.Fatalf("CSINode %s lists %s with node ID %q, want %q (NodeGetInfo's)", name, d.Name, d.NodeID, e.nodeID(name))
			}
			listed++
		}
		return listed == len(want), nil
	})
	return name
}

// checkDetach checks pv's detach from node after an unmount:
// NodeUnpublish → NodeUnstage → the volume leaves volumesInUse → the
// VolumeAttachment is deleted → ControllerUnpublish → the
// VolumeAttachment is removed (kubeletorder.Checker.CheckDetach).
func (e *env) checkDetach(pv, node string) kubeletorder.DetachFacts {
	e.t.Helper()
	e.real.checked[[2]string{pv, e.nodeID(node)}] = true
	return e.real.order.CheckDetach(e.t, pv, node, e.nodeID(node))
}

// waitForcedDetach waits until the VolumeAttachment of pv on node is
// gone after a detach without an unmount (node's kubelet is gone) and
// checks it (kubeletorder.Checker.CheckForcedDetach): no Node call during
// ControllerUnpublish, which follows the VolumeAttachment's deletion and
// precedes its removal, and the deletion comes after the Node's. The
// volume is still staged and published on the node's endpoint: nothing
// unmounted it.
func (e *env) waitForcedDetach(pv, node string) {
	e.t.Helper()
	e.eventually("VolumeAttachment of "+pv+" on "+node+" deleted", func() (bool, error) {
		_, ok := e.getVA(e.vaName(pv, node))
		return !ok, nil
	})
	e.real.checked[[2]string{pv, e.nodeID(node)}] = true
	f := e.real.order.CheckForcedDetach(e.t, pv, node, e.nodeID(node))
	nodeGone := e.real.hist.MustFirst(e.t, "Node "+node+" deleted", func(c kubeletorder.Change) bool {
		return c.Type == watch.Deleted && kubeletorder.NodeNamed(node, func(*v1.Node) bool { return true })(c)
	})
	if f.Deleting.RV < nodeGone.RV {
		e.t.Errorf("VolumeAttachment of %s on %s deleted (%s) before the Node (%s)", pv, node, f.Deleting, nodeGone)
	}
	if nv := e.stack.Driver.NodeVolumes(e.nodeID(node)); nv.Staged[pv] == "" || len(nv.Published[pv]) == 0 {
		e.t.Errorf("%s is no longer staged and published on %s's endpoint (%+v): something unmounted it", pv, node, nv)
	}
}

// checkPodAttaches checks the attach of each volume of pod whose driver
// requires attaching: ControllerPublish → NodeStage → NodePublish, and
// the Pod Running only after the VolumeAttachment was attached
// (kubeletorder.Checker.CheckAttach).
func (e *env) checkPodAttaches(pod *v1.Pod) {
	e.t.Helper()
	for _, vol := range pod.Spec.Volumes {
		if vol.PersistentVolumeClaim == nil {
			continue
		}
		pvc, err := e.client.CoreV1().PersistentVolumeClaims(e.ns).Get(e.ctx, vol.PersistentVolumeClaim.ClaimName, metav1.GetOptions{})
		if err != nil {
			e.t.Fatalf("PVC %s of Pod %s: %v", vol.PersistentVolumeClaim.ClaimName, pod.Name, err)
		}
		pv, err := e.client.CoreV1().PersistentVolumes().Get(e.ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
		if err != nil {
			e.t.Fatalf("PV %s of Pod %s: %v", pvc.Spec.VolumeName, pod.Name, err)
		}
		csi := pv.Spec.CSI
		if csi == nil || csi.Driver != e.driver {
			continue
		}
		d, err := e.client.StorageV1().CSIDrivers().Get(e.ctx, csi.Driver, metav1.GetOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			e.t.Fatalf("CSIDriver %s: %v", csi.Driver, err)
		}
		if err == nil && d.Spec.AttachRequired != nil && !*d.Spec.AttachRequired {
			continue
		}
		e.real.order.CheckAttach(e.t, csi.VolumeHandle, pod.Spec.NodeName, e.nodeID(pod.Spec.NodeName), pod.Name)
	}
}

// checkEveryDetachChecked fails the test for each successful
// ControllerUnpublish of a real-kubelet env whose detach no check
// read: every detach of every test is checked.
func (e *env) checkEveryDetachChecked() {
	if e.real == nil || e.t.Failed() {
		return
	}
	for _, c := range e.stack.Driver.CallsTo("ControllerUnpublishVolume") {
		if c.Done() && c.Code == codes.OK && !e.real.checked[[2]string{c.VolumeID, c.NodeID}] {
			e.t.Errorf("the detach of %s from %s (ControllerUnpublish #%d) was not checked against the kubelet's order", c.VolumeID, c.NodeID, c.ID)
		}
	}
}

// stopKubeletOf stops node's hollow kubelet (SIGTERM): its Pods and
// volumes stay as they are, nothing reports them any more.
func (e *env) stopKubeletOf(node string) {
	e.t.Helper()
	if err := e.real.nodes[node].StopKubelet(); err != nil {
		e.t.Errorf("hollow node %s: %v", node, err)
	}
}

// restartKubeletOf stops node's hollow kubelet (SIGTERM) and starts it
// again: a kubelet restart, its Pods and volumes reconstructed.
func (e *env) restartKubeletOf(node string) {
	e.t.Helper()
	h := e.real.nodes[node]
	if err := h.StopKubelet(); err != nil {
		e.t.Fatalf("hollow node %s: %v", node, err)
	}
	if err := h.StartKubelet(e.ctx); err != nil {
		e.t.Fatal(err)
	}
}
