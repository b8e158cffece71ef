// Package kubelet_test runs latch's attach/detach controller and
// csi-attacher with the real kubelet (hollow-kubelet: Kubernetes v1.36.3's
// kubelet with kubemark's fake container runtime and fake mounter) on one
// node instead of the kubelet stand-in, and the mock CSI driver's node
// plugin registered with that kubelet. It asserts the contract the
// controller's safety rests on, from the mock's call log and the API's
// history: mount only after attach, detach only after unmount.
package kubelet_test

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/latchcsi/latch/internal/attacher"
	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/localcluster"
	"github.com/latchcsi/latch/internal/stack"
	"github.com/latchcsi/latch/internal/testsupport"
)

var (
	cluster *localcluster.Cluster
	runSeq  atomic.Int32
)

func TestMain(m *testing.M) { stack.RunTestMain(m, &cluster) }

const (
	// publishDelay keeps the VolumeAttachment unattached for a while
	// after the Pod is on the node, so a kubelet that mounted without
	// waiting for the attach would be seen doing it.
	publishDelay = 2 * time.Second
	// unstageDelay keeps NodeUnstageVolume in flight for a while, so a
	// kubelet that dropped the volume from volumesInUse before the
	// unmount finished would be seen doing it.
	unstageDelay = 1500 * time.Millisecond
)

// TestKubeletVolumeLifecycle: with the real kubelet, the mock driver's
// node plugin is registered (CSINode written by the kubelet with the node
// ID NodeGetInfo reports); a Pod with a CSI volume of an attachRequired
// driver runs only once its VolumeAttachment is attached, after
// ControllerPublish → NodeStage → NodePublish; deleting it gives
// NodeUnpublish → NodeUnstage → volume leaves volumesInUse →
// VolumeAttachment deleted → ControllerUnpublish, in that order.
func TestKubeletVolumeLifecycle(t *testing.T) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const driver = "mock.csi.latch.dev"
	s, err := stack.Start(ctx, stack.Options{
		Cluster:   cluster,
		Driver:    driver,
		NoKubelet: true,
		Mock: func(c *csimock.Config) {
			c.Faults = append(c.Faults,
				csimock.Rule{ID: "slow-publish", Method: "ControllerPublishVolume", Latency: publishDelay},
				csimock.Rule{ID: "slow-unstage", Method: "NodeUnstageVolume", Latency: unstageDelay})
		},
		AttacherConfig: func(_ int, c *attacher.SidecarConfig) { stack.QuickAttacher(c) },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Error(err)
		}
	})
	client := s.Client
	if _, err := client.StorageV1().CSIDrivers().Create(ctx, localcluster.NewCSIDriver(driver, new(true)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.StorageV1().CSIDrivers().Delete(context.Background(), driver, metav1.DeleteOptions{})
	})
	// Unique per run: the package's tests share one control plane.
	n := strconv.Itoa(int(runSeq.Add(1)))
	ns, node, vol := "kubelet-e2e-"+n, "hollow-"+n, "kubelet-vol-"+n
	if err := localcluster.CreateNamespace(ctx, client, ns); err != nil {
		t.Fatal(err)
	}
	hist := recordHistory(t, ctx, client, ns)

	kubeletLog := &testsupport.SyncBuffer{}
	h, err := s.StartHollowNode(ctx, stack.HollowOptions{Name: node, RootDir: t.TempDir(), Output: kubeletLog})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.Stop(); err != nil {
			t.Errorf("hollow kubelet: %v", err)
		}
		if t.Failed() {
			t.Logf("hollow kubelet log (tail):\n%s", tail(kubeletLog.String(), 150))
		}
	})
	dumpCalls := func() { t.Logf("mock driver calls:\n%s", callTable(s.Driver.Calls())) }

	// Registration: the kubelet finds <root>/plugins_registry/<driver>-reg.sock,
	// asks NodeGetInfo on the node socket and writes the CSINode.
	nodeID := stack.NodeID(node)
	testsupport.Eventually(t, ctx, 90*time.Second, "the kubelet registers Node "+node+" Ready and the driver in its CSINode", func(ctx context.Context) (bool, error) {
		n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil || !nodeReady(n) {
			return false, err
		}
		cn, err := client.StorageV1().CSINodes().Get(ctx, node, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		for _, d := range cn.Spec.Drivers {
			if d.Name == driver {
				if d.NodeID != nodeID {
					t.Fatalf("CSINode %s lists %s with node ID %q, want %q (NodeGetInfo's)", node, driver, d.NodeID, nodeID)
				}
				return true, nil
			}
		}
		return false, nil
	}, dumpCalls)
	// The kubelet notifies the plugin after it registered it.
	testsupport.Eventually(t, ctx, 10*time.Second, "the kubelet notifies the registration's success", func(context.Context) (bool, error) {
		st := h.Endpoint.Registration()
		if st.Notified && (!st.Registered || st.Error != "" || st.InfoCalls == 0) {
			t.Fatalf("registration status %+v: want GetInfo called and the kubelet's success notified", st)
		}
		return st.Notified, nil
	})
	if n, ok := lastCall(s.Driver.NodeCalls(nodeID), "NodeGetInfo"); !ok || n.Code != codes.OK {
		t.Fatalf("the kubelet asked no NodeGetInfo on the node socket: %+v", s.Driver.NodeCalls(nodeID))
	}
	t.Logf("node %s Ready, driver registered after %s", node, time.Since(start).Round(time.Millisecond))

	// Attach and mount.
	if _, _, err := localcluster.CreateBoundVolume(ctx, client, localcluster.VolumeSpec{Namespace: ns, Name: vol, Driver: driver}); err != nil {
		t.Fatal(err)
	}
	pod := localcluster.NewPod(ns, "app", node, vol)
	pod.Spec.AutomountServiceAccountToken = new(false) // no root-ca publisher runs
	if _, err := client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	vaName := kube.VolumeAttachmentName(vol, driver, node)
	unique := kube.UniqueVolumeName(driver, vol)
	testsupport.Eventually(t, ctx, 90*time.Second, "Pod app Running", func(ctx context.Context) (bool, error) {
		p, err := client.CoreV1().Pods(ns).Get(ctx, "app", metav1.GetOptions{})
		return err == nil && p.Status.Phase == v1.PodRunning, err
	}, dumpCalls)
	t.Logf("Pod Running after %s", time.Since(start).Round(time.Millisecond))

	attached := hist.mustFirst(t, "VolumeAttachment "+vaName+" attached", vaNamed(vaName, func(va *storagev1.VolumeAttachment) bool { return va.Status.Attached }))
	running := hist.mustFirst(t, "Pod app Running", podNamed("app", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodRunning }))
	if running.RV < attached.RV {
		t.Errorf("Pod Running (%s) before its VolumeAttachment was attached (%s)", running, attached)
	}
	inUseAdded := hist.mustFirst(t, "volume in Node "+node+"'s volumesInUse", nodeNamed(node, func(n *v1.Node) bool { return inUse(n, unique) }))
	if attached.RV < inUseAdded.RV {
		t.Logf("note: the VolumeAttachment was attached (RV %d) before the kubelet reported the volume in use (RV %d)", attached.RV, inUseAdded.RV)
	}
	calls := s.Driver.Calls()
	publish := mustCall(t, calls, "ControllerPublishVolume", vol, codes.OK)
	stage := mustCall(t, calls, "NodeStageVolume", vol, codes.OK)
	nodePublish := mustCall(t, calls, "NodePublishVolume", vol, codes.OK)
	if publish.NodeID != nodeID || stage.Endpoint != nodeID || nodePublish.Endpoint != nodeID {
		t.Errorf("calls not on node %s: publish to %q, stage on %q, node publish on %q", nodeID, publish.NodeID, stage.Endpoint, nodePublish.Endpoint)
	}
	if !publish.End.Before(stage.Start) || !stage.End.Before(nodePublish.Start) {
		t.Errorf("want ControllerPublish → NodeStage → NodePublish, got\n%s", callTable(calls))
	}
	if nv := s.Driver.NodeVolumes(nodeID); nv.Staged[vol] == "" || len(nv.Published[vol]) != 1 {
		t.Errorf("node %s's volumes while the Pod runs: %+v, want %s staged and published once", nodeID, nv, vol)
	}

	// Unmount and detach.
	if err := client.CoreV1().Pods(ns).Delete(ctx, "app", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, ctx, 2*time.Minute, "Pod app gone, VolumeAttachment "+vaName+" gone, ControllerUnpublish done", func(ctx context.Context) (bool, error) {
		if _, err := client.CoreV1().Pods(ns).Get(ctx, "app", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return false, nil
		}
		if _, err := client.StorageV1().VolumeAttachments().Get(ctx, vaName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return false, nil
		}
		_, ok := findCall(s.Driver.Calls(), "ControllerUnpublishVolume", vol, codes.OK)
		return ok, nil
	}, dumpCalls)
	t.Logf("Pod deleted, volume detached after %s", time.Since(start).Round(time.Millisecond))

	calls = s.Driver.Calls()
	unpublish := mustCall(t, calls, "NodeUnpublishVolume", vol, codes.OK)
	unstage := mustCall(t, calls, "NodeUnstageVolume", vol, codes.OK)
	ctrlUnpublish := mustCall(t, calls, "ControllerUnpublishVolume", vol, codes.OK)
	if !unpublish.End.Before(unstage.Start) {
		t.Errorf("NodeUnstage started before NodeUnpublish ended:\n%s", callTable(calls))
	}
	dropped := hist.mustFirst(t, "volume leaves Node "+node+"'s volumesInUse", after(inUseAdded.RV, nodeNamed(node, func(n *v1.Node) bool { return !inUse(n, unique) })))
	// The unstage takes unstageDelay: a kubelet that reported the volume
	// unused before the unmount finished would be seen here.
	if !dropped.Observed.After(unstage.End) {
		t.Errorf("volume left volumesInUse (%s) before NodeUnstage ended (%s)", dropped, unstage.End.Format("15:04:05.000"))
	}
	deleting := hist.mustFirst(t, "VolumeAttachment "+vaName+" deleted", vaNamed(vaName, func(va *storagev1.VolumeAttachment) bool { return va.DeletionTimestamp != nil }))
	if deleting.RV < dropped.RV {
		t.Errorf("VolumeAttachment deleted (%s) before the volume left volumesInUse (%s)", deleting, dropped)
	}
	va := deleting.Obj.(*storagev1.VolumeAttachment)
	if ctrlUnpublish.Start.Before(va.DeletionTimestamp.Time) || ctrlUnpublish.Start.Before(unstage.End) {
		t.Errorf("ControllerUnpublish (%s) before the VolumeAttachment's deletion (%s) or NodeUnstage's end (%s)",
			ctrlUnpublish.Start.Format("15:04:05.000"), va.DeletionTimestamp.Format("15:04:05"), unstage.End.Format("15:04:05.000"))
	}
	if len(va.Finalizers) == 0 {
		t.Errorf("the deleted VolumeAttachment carried no finalizer: nothing held it until ControllerUnpublish")
	}
	gone := hist.mustFirst(t, "VolumeAttachment "+vaName+" removed", func(c change) bool {
		return c.Type == watch.Deleted && vaNamed(vaName, func(*storagev1.VolumeAttachment) bool { return true })(c)
	})
	if !gone.Observed.After(ctrlUnpublish.End) {
		t.Errorf("VolumeAttachment removed (%s) before ControllerUnpublish ended", gone)
	}
	if nv := s.Driver.NodeVolumes(nodeID); len(nv.Staged)+len(nv.Published) != 0 {
		t.Errorf("node %s still has volumes after the Pod's deletion: %+v", nodeID, nv)
	}
	if got := s.Driver.Published(vol); len(got) != 0 {
		t.Errorf("volume %s still published to %v", vol, got)
	}
	t.Logf("order: ControllerPublish %s, NodeStage %s, NodePublish %s, Pod Running RV %d (VA attached RV %d); NodeUnpublish %s, NodeUnstage %s–%s, volumesInUse dropped RV %d, VA deleted RV %d, ControllerUnpublish %s",
		stamp(publish.End), stamp(stage.Start), stamp(nodePublish.Start), running.RV, attached.RV,
		stamp(unpublish.Start), stamp(unstage.Start), stamp(unstage.End), dropped.RV, deleting.RV, stamp(ctrlUnpublish.Start))
}

func nodeReady(n *v1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == v1.NodeReady {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}

func stamp(t time.Time) string { return t.Format("15:04:05.000") }

func tail(s string, lines int) string {
	l := strings.Split(s, "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}
