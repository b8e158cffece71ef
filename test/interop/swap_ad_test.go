package interop

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/stack"
)

// The attach/detach swap as an operator runs it: kube-controller-manager
// with every controller (--controllers=*, the attach/detach controller
// among them) and leader election on, restarted with
// --controllers=*,-attachdetach beside latch's attachdetach-controller,
// and back. Its node lifecycle controller needs nodes that heartbeat: the
// nodes here are hollow kubelets (the real kubelet with kubemark's fake
// runtime and mounter), which register, renew their node Lease, mount
// volumes through the mock driver's node plugin and report volumesInUse.

const (
	// kcmLease is kube-controller-manager's Lease (kube-system).
	kcmLease = "kube-controller-manager"
	// latchADLease is attachdetach-controller's (kube-system).
	latchADLease = "latch-attachdetach-controller"
)

// leaseState is who holds a Lease and how often it changed hands.
type leaseState struct {
	holder      string
	transitions int32
}

func (l leaseState) String() string {
	return fmt.Sprintf("holder %q, %d transitions", l.holder, l.transitions)
}

// lease reads the Lease ns/name (ok false: none yet).
func (w *world) lease(ns, name string) (_ leaseState, ok bool) {
	w.t.Helper()
	l, err := w.s.Client.CoordinationV1().Leases(ns).Get(w.ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return leaseState{}, false
	}
	if err != nil {
		w.t.Fatal(err)
	}
	var s leaseState
	if l.Spec.HolderIdentity != nil {
		s.holder = *l.Spec.HolderIdentity
	}
	if l.Spec.LeaseTransitions != nil {
		s.transitions = *l.Spec.LeaseTransitions
	}
	return s, true
}

// waitLease waits until the Lease ns/name satisfies cond and returns it.
func (w *world) waitLease(ns, name, what string, cond func(leaseState) bool) leaseState {
	w.t.Helper()
	var got leaseState
	w.eventually(fmt.Sprintf("Lease %s/%s %s", ns, name, what), func(context.Context) (bool, error) {
		s, ok := w.lease(ns, name)
		got = s
		return ok && cond(s), nil
	})
	return got
}

func held(l leaseState) bool { return l.holder != "" }

// handedOver: the Lease is held by another holder than before, one more
// transition.
func handedOver(before leaseState) func(leaseState) bool {
	return func(l leaseState) bool {
		return l.holder != "" && l.holder != before.holder && l.transitions > before.transitions
	}
}

// newHollowWorld starts a control plane with two hollow nodes (node-a,
// node-b), the mock driver (controller service and, on each node, the
// node plugin the kubelet registers), kube-controller-manager with every
// controller and leader election, and latch's csi-attacher with
// swapAttacherArgs (leader election on).
func newHollowWorld(t *testing.T, ctx context.Context) *world {
	t.Helper()
	// kube-controller-manager's files (kubeconfig, service-account key,
	// root CA, serving certificate), removed after everything stopped.
	cpDir, err := os.MkdirTemp("", "ikcm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(cpDir) })
	w := startWorld(t, ctx, pair{kcmAD, latchAt}, stack.Options{
		Driver: driver, Attacher: stack.AttacherOnDemand, NoController: true, NoKubelet: true,
	})
	w.kcmDir = cpDir
	w.kcm = w.startKCM("*")

	var nodes []*stack.HollowNode
	var roots []string
	w.stopNodes = func() {
		for _, h := range nodes {
			if err := h.Stop(); err != nil {
				t.Errorf("hollow node %s: %v", h.Name, err)
			}
		}
		for _, r := range roots {
			os.RemoveAll(r)
		}
	}
	for _, n := range worldNodes {
		root, err := os.MkdirTemp("", "hk") // short: unix sockets under it
		if err != nil {
			t.Fatal(err)
		}
		roots = append(roots, root)
		h, err := w.s.StartHollowNode(ctx, stack.HollowOptions{Name: n, RootDir: root, Output: prefixed(w.out, "kubelet-"+n)})
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, h)
	}
	for _, n := range worldNodes {
		w.waitNodeReady(n)
	}
	w.attacher = w.startAttacher(latchAt, swapAttacherArgs)
	return w
}

// startKCM starts kube-controller-manager with controllers (its
// --controllers), leader election on with its defaults, the API server's
// service-account key and the cluster CA (stack.StartControllerManager).
func (w *world) startKCM(controllers ...string) *peer {
	w.t.Helper()
	w.seq++
	name := fmt.Sprintf("kcm-%d", w.seq)
	u, err := stack.StartControllerManager(w.ctx, w.s.Cluster, stack.ControlPlaneConfig{
		Dir: w.kcmDir, Output: prefixed(w.out, name), Controllers: controllers, Args: []string{"--leader-elect=true"},
	})
	if err != nil {
		w.t.Fatal(err)
	}
	return &peer{name: name, args: u.Args, comp: u.Component, up: u, metricsURL: u.MetricsURL}
}

// waitNodeReady waits for the kubelet to register node Ready with the
// driver in its CSINode under the mock's node ID.
func (w *world) waitNodeReady(node string) {
	w.t.Helper()
	w.eventually("Node "+node+" Ready with "+driver+" in its CSINode", func(ctx context.Context) (bool, error) {
		n, err := w.s.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		ready := false
		for _, c := range n.Status.Conditions {
			if c.Type == "Ready" && c.Status == "True" {
				ready = true
			}
		}
		if !ready {
			return false, nil
		}
		cn, err := w.s.Client.StorageV1().CSINodes().Get(ctx, node, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		for _, d := range cn.Spec.Drivers {
			if d.Name == driver && d.NodeID == stack.NodeID(node) {
				return true, nil
			}
		}
		return false, nil
	})
}

// nodesStayReady fails the test if a node is not Ready: kcm's node
// lifecycle controller would then taint it and the swap would be
// measured on nodes being evicted.
func (w *world) nodesStayReady() {
	w.t.Helper()
	for _, n := range worldNodes {
		for _, c := range w.node(n).Status.Conditions {
			if c.Type == "Ready" && c.Status != "True" {
				w.t.Errorf("node %s is not Ready (%s: %s)", n, c.Reason, c.Message)
			}
		}
	}
}

// TestSwapAttachDetach_kcmToLatchAndBack runs the attach/detach swap of
// docs/migration.md's runbook on nodes that heartbeat, with leader
// election on everywhere: kube-controller-manager --controllers=* (its
// attach/detach controller on) → restarted with
// --controllers=*,-attachdetach and latch's attachdetach-controller
// started → latch's stopped and kube-controller-manager restarted with
// --controllers=* again, each swap while attaches and detaches are in
// flight. csi-attacher (latch's) runs throughout.
func TestSwapAttachDetach_kcmToLatchAndBack(t *testing.T) {
	t.Parallel() // a world of its own, mostly waiting (worldsAtOnce)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	w := newHollowWorld(t, ctx)
	kcm := w.waitLease("kube-system", kcmLease, "held by kube-controller-manager", held)
	at := w.waitLease("default", leaseName, "held by csi-attacher", held)
	l := newWorkload(w, "swap-ad")
	l.add(4)
	l.settled(nil, true)

	// Swap: kcm without its attach/detach controller, latch's started.
	gone, stop := l.inFlight()
	w.stop(w.kcm)
	stopped := time.Now()
	w.kcm = w.startKCM(stack.ControllersExceptAttachDetach...)
	w.ctrl = w.startController(latchAD, controllerOptions{leaderElect: true})
	before := kcm
	kcm = w.waitLease("kube-system", kcmLease, "handed over to the restarted kube-controller-manager", handedOver(kcm))
	ad := w.waitLease("kube-system", latchADLease, "held by attachdetach-controller", held)
	w.leaderElectionEvent("kube-system", latchADLease, ad.holder, "attachdetach-controller")
	t.Logf("swap: kcm Lease %s → %s (%s after the old kcm stopped); attachdetach-controller's %s", before, kcm, time.Since(stopped).Round(time.Second), ad)
	stop()
	l.settled(gone, false)
	l.add(2)
	l.settled(nil, true)
	w.nodesStayReady()

	// Rollback: latch's stopped (it releases its Lease), kcm restarted
	// with its attach/detach controller.
	gone, stop = l.inFlight()
	w.stop(w.ctrl)
	w.ctrl = nil
	w.waitLease("kube-system", latchADLease, "released by the stopped attachdetach-controller", func(l leaseState) bool { return l.holder == "" })
	w.stop(w.kcm)
	stopped = time.Now()
	w.kcm = w.startKCM("*")
	back := w.waitLease("kube-system", kcmLease, "handed over to kube-controller-manager with attachdetach", handedOver(kcm))
	w.leaderElectionEvent("kube-system", kcmLease, back.holder, "kube-controller-manager")
	t.Logf("rollback: kcm Lease %s → %s (%s after the old kcm stopped)", kcm, back, time.Since(stopped).Round(time.Second))
	stop()
	l.settled(gone, false)
	l.add(2)
	l.settled(nil, true)
	w.nodesStayReady()

	l.checkPVFinalizers()
	l.drain()
	l.checkPVFinalizersGone()
	if got, _ := w.lease("default", leaseName); got.holder != at.holder {
		t.Errorf("csi-attacher's Lease changed hands during the attach/detach swap: %s, was %s", got, at)
	}
}
