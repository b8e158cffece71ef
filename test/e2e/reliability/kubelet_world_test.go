package reliability_test

// The real-kubelet world of TestChaos_realKubelets_seededFaultsInvariantsHold:
// the suite's env (mock driver that records a single-node volume
// published to two nodes instead of refusing it, supervised in-process
// csi-attacher, killable attach/detach controller) without the kubelet
// stand-in; each node is a hollow kubelet (stack.StartHollowNode: the
// real v1.37.2 kubelet with kubemark's fake runtime and mounter) with the
// mock driver's node endpoint for it, and an API history of Nodes,
// VolumeAttachments and the world's Pods feeds kubeletorder's checks.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/attachdetach/controller"
	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/kube/kubenames"
	"github.com/latchcsi/latch/internal/localcluster"
	"github.com/latchcsi/latch/internal/stack"
	"github.com/latchcsi/latch/internal/testsupport"
	"github.com/latchcsi/latch/internal/testsupport/kubeletorder"
)

// kubeletWorld is an env whose nodes run the real kubelet.
type kubeletWorld struct {
	*env
	hist  *kubeletorder.History
	order *kubeletorder.Checker
	// hollow and logs are by Node name; byID maps a CSI node ID
	// (stack.NodeID) back to its Node.
	hollow map[string]*stack.HollowNode
	logs   map[string]*testsupport.SyncBuffer
	byID   map[string]string
}

// newKubeletWorld starts the stack without the kubelet stand-in, one
// csi-attacher and the attach/detach controller (cfg), records the API
// history, and starts nodes hollow nodes, waiting until each kubelet has
// registered its Node Ready and the driver in its CSINode.
func newKubeletWorld(t *testing.T, cfg controller.Config, nodes int) *kubeletWorld {
	t.Helper()
	if cfg.Workers == 0 {
		cfg.Workers = 8
	}
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), klog.Background()))
	t.Cleanup(cancel)
	client := cluster.Client()
	names := worlds.New(t, ctx, client, "")
	e := &env{
		t: t, ctx: ctx, client: client, opts: options{replicas: 1, ctrl: cfg},
		prefix: names.Prefix, ns: names.Namespace, driver: names.Driver,
	}
	s, err := stack.Start(ctx, stack.Options{
		Cluster: cluster, Driver: e.driver, NoKubelet: true,
		// As in newEnv: the driver records a single-node volume published
		// to a second node instead of refusing it.
		Mock:     func(cfg *csimock.Config) { cfg.SkipSingleNodeCheck = true },
		Attacher: stack.AttacherOnDemand, RestartAttachers: true,
		NoController: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	e.stack, e.mock, e.socket = s, s.Driver, s.Socket
	w := &kubeletWorld{env: e, hollow: map[string]*stack.HollowNode{}, logs: map[string]*testsupport.SyncBuffer{}, byID: map[string]string{}}
	t.Cleanup(w.cleanup)
	w.hist = kubeletorder.Record(t, ctx, client, e.ns)
	w.order = &kubeletorder.Checker{Driver: e.mock, DriverName: e.driver, History: w.hist}
	e.attachers = append(e.attachers, e.startAttacher(e.prefix+"-attacher-0"))
	e.startController()

	for i := range nodes {
		name := fmt.Sprintf("%s-n%d", e.prefix, i)
		log := &testsupport.SyncBuffer{}
		h, err := e.stack.StartHollowNode(ctx, stack.HollowOptions{Name: name, RootDir: testsupport.SocketDir(t), Output: log})
		if err != nil {
			t.Fatal(err)
		}
		e.nodes = append(e.nodes, name)
		w.hollow[name], w.logs[name], w.byID[stack.NodeID(name)] = h, log, name
	}
	for _, name := range e.nodes {
		e.eventually(90*time.Second, "the kubelet registers Node "+name+" Ready and the driver in its CSINode", func() bool {
			no, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil || !kube.NodeReady(no) {
				return false
			}
			cn, err := client.StorageV1().CSINodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false
			}
			for _, d := range cn.Spec.Drivers {
				if d.Name == e.driver {
					if d.NodeID != stack.NodeID(name) {
						t.Fatalf("CSINode %s lists %s with node ID %q, want %q (NodeGetInfo's)", name, e.driver, d.NodeID, stack.NodeID(name))
					}
					return true
				}
			}
			return false
		})
	}
	return w
}

// mustPod is pod that fails the test on an error.
func (w *kubeletWorld) mustPod(name, node, claim string) {
	w.t.Helper()
	if err := w.pod(name, node, claim); err != nil {
		w.t.Fatal(err)
	}
}

// waitRunning waits for Pod name to be Running.
func (w *kubeletWorld) waitRunning(name string) {
	w.t.Helper()
	w.eventually(90*time.Second, "Pod "+name+" Running", func() bool {
		p, err := w.client.CoreV1().Pods(w.ns).Get(w.ctx, name, metav1.GetOptions{})
		return err == nil && p.Status.Phase == v1.PodRunning
	})
}

// waitPodGone waits for Pod name to be removed (the kubelet unmounted its
// volumes first).
func (w *kubeletWorld) waitPodGone(name string) {
	w.t.Helper()
	w.eventually(90*time.Second, "Pod "+name+" gone", func() bool {
		gone, err := w.podGone(name)
		if err != nil {
			w.t.Log(err)
		}
		return gone
	})
}

// pod creates a Pod on node using claim. The real kubelet would mount a
// service account token: no root-ca publisher runs to give it the CA
// bundle, so the Pod asks for none.
func (w *kubeletWorld) pod(name, node, claim string) error {
	p := newKubeletPod(w.ns, name, node, claim)
	_, err := w.client.CoreV1().Pods(w.ns).Create(w.ctx, p, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create Pod %s on %s with %s: %w", name, node, claim, err)
	}
	return nil
}

// podGone reports whether Pod name no longer exists.
func (w *kubeletWorld) podGone(name string) (bool, error) {
	_, err := w.client.CoreV1().Pods(w.ns).Get(w.ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("get Pod %s: %w", name, err)
	}
	return false, nil
}

// checkDetaches checks every successful ControllerUnpublish of the run
// with kubeletorder's CheckDetach (NodeUnpublish → NodeUnstage → the
// volume leaves volumesInUse → the VolumeAttachment is deleted →
// ControllerUnpublish → it is removed) and returns how many it checked.
// Each volume reaches each node at most once in a run (the chaos gives a
// volume that has been everywhere a fresh successor), so one
// VolumeAttachment's life is all there is of a volume on a node, which
// CheckDetach reads.
func (w *kubeletWorld) checkDetaches() int {
	w.t.Helper()
	seen := map[[2]string]bool{}
	for _, c := range w.mock.CallsTo("ControllerUnpublishVolume") {
		k := [2]string{c.VolumeID, c.NodeID}
		if !c.Done() || c.Code != codes.OK || seen[k] {
			continue
		}
		seen[k] = true
		node, ok := w.byID[c.NodeID]
		if !ok {
			w.t.Errorf("ControllerUnpublish #%d of %s from node ID %q, which no node of the world reports", c.ID, c.VolumeID, c.NodeID)
			continue
		}
		if w.removedOutright(c.VolumeID, node) {
			continue
		}
		tb := &recordingTB{TB: w.t, onFail: func() { w.explain(c.VolumeID, node) }}
		w.order.CheckDetach(tb, c.VolumeID, node, c.NodeID)
		if tb.failed {
			w.explain(c.VolumeID, node)
		}
	}
	return len(seen)
}

// checkNothingLeft asserts the world at rest after every Pod is gone: no
// VolumeAttachment of the driver, nothing published in the driver,
// nothing staged or published on any node's endpoint, no entry in any
// Node's volumesAttached or volumesInUse.
func (w *kubeletWorld) checkNothingLeft(timeout time.Duration) {
	w.t.Helper()
	var problems []string
	err := testsupport.Poll(w.ctx, timeout, func(context.Context) (bool, error) {
		problems = nil
		for _, va := range w.vas() {
			problems = append(problems, fmt.Sprintf("VolumeAttachment %s (%s on %s) left, attached=%v deleting=%v", va.Name, ptrStr(va.Spec.Source.PersistentVolumeName), va.Spec.NodeName, va.Status.Attached, va.DeletionTimestamp != nil))
		}
		for _, v := range w.mock.State().Volumes {
			if len(v.Published) > 0 {
				problems = append(problems, fmt.Sprintf("the driver still has %s published to %+v", v.ID, v.Published))
			}
		}
		for _, n := range w.nodes {
			nv := w.mock.NodeVolumes(stack.NodeID(n))
			if len(nv.Staged) > 0 || len(nv.Published) > 0 {
				problems = append(problems, fmt.Sprintf("node %s's endpoint still has staged %v, published %v", n, nv.Staged, nv.Published))
			}
			no, err := w.client.CoreV1().Nodes().Get(w.ctx, n, metav1.GetOptions{})
			if err != nil {
				return false, fmt.Errorf("get Node %s: %w", n, err)
			}
			if len(no.Status.VolumesAttached) > 0 || len(no.Status.VolumesInUse) > 0 {
				problems = append(problems, fmt.Sprintf("Node %s still lists volumesAttached %v, volumesInUse %v", n, no.Status.VolumesAttached, no.Status.VolumesInUse))
			}
		}
		return len(problems) == 0, nil
	})
	if err != nil {
		w.dump()
		w.t.Errorf("the world did not come to rest within %s (%v):\n  %s", timeout, err, strings.Join(problems, "\n  "))
	}
}

// cleanup stops the hollow kubelets (their logs shown when the test
// failed), the controllers and the driver, and removes the world's Pods,
// Nodes and CSINodes and anything of the driver's still left.
func (w *kubeletWorld) cleanup() {
	ctx := context.WithoutCancel(w.ctx)
	w.mock.ClearFaults()
	for _, n := range w.nodes {
		h := w.hollow[n]
		if err := h.Stop(); err != nil {
			w.t.Errorf("hollow node %s: %v", n, err)
		}
		if w.t.Failed() {
			w.t.Logf("hollow kubelet %s log (tail):\n%s", n, tailLines(w.logs[n].String(), 60))
		}
	}
	if err := w.stack.Stop(); err != nil {
		w.t.Errorf("stopping the controllers: %v", err)
	}
	pods, _ := w.client.CoreV1().Pods(w.ns).List(ctx, metav1.ListOptions{})
	for _, p := range pods.Items {
		_ = w.client.CoreV1().Pods(w.ns).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	}
	for _, n := range w.nodes {
		_ = w.client.CoreV1().Nodes().Delete(ctx, n, metav1.DeleteOptions{})
		_ = w.client.StorageV1().CSINodes().Delete(ctx, n, metav1.DeleteOptions{})
	}
	for _, va := range w.vas() {
		_ = w.client.StorageV1().VolumeAttachments().Delete(ctx, va.Name, metav1.DeleteOptions{})
		if len(va.Finalizers) > 0 {
			patch := []byte(`{"metadata":{"finalizers":null}}`)
			_, _ = w.client.StorageV1().VolumeAttachments().Patch(ctx, va.Name, "application/merge-patch+json", patch, metav1.PatchOptions{})
		}
	}
}

func tailLines(s string, lines int) string {
	l := strings.Split(s, "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}

// recordingTB passes everything to the test and notes a failure, so a
// check's caller can log what explains it.
type recordingTB struct {
	testing.TB
	failed bool
	onFail func()
}

func (r *recordingTB) Errorf(format string, args ...any) {
	r.TB.Helper()
	r.failed = true
	r.TB.Errorf(format, args...)
}

func (r *recordingTB) Fatalf(format string, args ...any) {
	r.TB.Helper()
	r.failed = true
	r.onFail()
	r.TB.Fatalf(format, args...)
}

// explain logs the life of vol on node: the driver's calls of it there,
// and, from the API history, each change of its VolumeAttachment, each
// change of the Node's volumesInUse and volumesAttached for it, and the
// changes of the Pods that used it there.
func (w *kubeletWorld) explain(vol, node string) {
	nodeID := stack.NodeID(node)
	var b strings.Builder
	fmt.Fprintf(&b, "the life of %s on %s:\n", vol, node)
	b.WriteString(kubeletorder.CallTable(kubeletorder.VolumeCalls(w.mock.Calls(), vol, nodeID)))
	va := kubenames.VolumeAttachmentName(vol, w.driver, node)
	unique := kubenames.UniqueVolumeName(w.driver, vol)
	attachedTo := func(n *v1.Node) bool {
		return slices.ContainsFunc(n.Status.VolumesAttached, func(a v1.AttachedVolume) bool { return a.Name == unique })
	}
	var lastNode string
	rv := uint64(0)
	for {
		c, ok := w.hist.First(kubeletorder.After(rv, func(kubeletorder.Change) bool { return true }))
		if !ok {
			break
		}
		rv = c.RV
		switch o := c.Obj.(type) {
		case *storagev1.VolumeAttachment:
			if o.Name == va {
				fmt.Fprintf(&b, "  RV %d %s %s VolumeAttachment attached=%v deleting=%v finalizers=%v\n", c.RV, kubeletorder.Stamp(c.Observed), c.Type, o.Status.Attached, o.DeletionTimestamp != nil, o.Finalizers)
			}
		case *v1.Node:
			if o.Name == node {
				s := fmt.Sprintf("inUse=%v attached=%v ready=%v", kubeletorder.InUse(o, unique), attachedTo(o), kube.NodeReady(o))
				if s != lastNode {
					fmt.Fprintf(&b, "  RV %d %s Node %s\n", c.RV, kubeletorder.Stamp(c.Observed), s)
					lastNode = s
				}
			}
		case *v1.Pod:
			if o.Spec.NodeName == node && slices.ContainsFunc(o.Spec.Volumes, func(v v1.Volume) bool {
				return v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ClaimName == vol
			}) {
				fmt.Fprintf(&b, "  RV %d %s %s Pod %s phase=%s deleting=%v\n", c.RV, kubeletorder.Stamp(c.Observed), c.Type, o.Name, o.Status.Phase, o.DeletionTimestamp != nil)
			}
		}
	}
	w.t.Log(b.String())
}

// newKubeletPod is localcluster.NewPod without a service account token
// (no root-ca publisher runs to give the real kubelet the CA bundle).
func newKubeletPod(ns, name, node, claim string) *v1.Pod {
	p := localcluster.NewPod(ns, name, node, claim)
	p.Spec.AutomountServiceAccountToken = new(false)
	return p
}

// removedOutright reports whether vol's VolumeAttachment on node went
// from the API in one step, never marked deleted, and checks that
// detach. Seen once (seed 1795676076185502302): the controller deleted a
// VolumeAttachment (UID precondition) the instant csi-attacher added its
// finalizer, and the API server removed it at once, the finalizer
// notwithstanding; csi-attacher's ControllerPublish had succeeded and its
// orphan path unpublished the volume. CheckDetach reads a deletion mark
// there is not; this check asserts instead that the kubelet never staged
// or published the volume there (no Node call of it on that node) and
// that an OK ControllerUnpublish followed the last OK ControllerPublish;
// checkNothingLeft asserts the rest.
func (w *kubeletWorld) removedOutright(vol, node string) bool {
	va := kubenames.VolumeAttachmentName(vol, w.driver, node)
	if _, marked := w.hist.First(kubeletorder.VANamed(va, func(va *storagev1.VolumeAttachment) bool { return va.DeletionTimestamp != nil })); marked {
		return false
	}
	gone, ok := w.hist.First(func(c kubeletorder.Change) bool {
		return c.Type == watch.Deleted && kubeletorder.VANamed(va, func(*storagev1.VolumeAttachment) bool { return true })(c)
	})
	if !ok {
		return false
	}
	w.t.Logf("VolumeAttachment %s (%s on %s) was removed without a deletion mark (%s)", va, vol, node, gone)
	nodeID := stack.NodeID(node)
	var lastPublish, lastUnpublish csimock.Call
	for _, c := range kubeletorder.VolumeCalls(w.mock.Calls(), vol, nodeID) {
		switch {
		case kubeletorder.IsNodeMethod(c.Method):
			w.t.Errorf("%s of %s on %s (#%d at %s) although its VolumeAttachment went without a deletion mark", c.Method, vol, node, c.ID, kubeletorder.Stamp(c.Start))
		case c.Method == "ControllerPublishVolume" && c.Done() && c.Code == codes.OK:
			lastPublish = c
		case c.Method == "ControllerUnpublishVolume" && c.Done() && c.Code == codes.OK:
			lastUnpublish = c
		}
	}
	if !lastPublish.End.IsZero() && !lastUnpublish.Start.After(lastPublish.End) {
		w.t.Errorf("%s was published to %s (#%d) and not unpublished after it (last ControllerUnpublish #%d)", vol, node, lastPublish.ID, lastUnpublish.ID)
	}
	return true
}
