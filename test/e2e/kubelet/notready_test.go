package kubelet_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/attachdetach/controller"
	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/kube/kubenames"
	"github.com/latchcsi/latch/internal/stack"
	"github.com/latchcsi/latch/internal/testsupport"
)

// nodeMonitorGrace is kube-controller-manager's
// --node-monitor-grace-period here: a node whose kubelet stopped
// reporting goes NotReady (Ready=Unknown) this long after its last
// heartbeat.
const nodeMonitorGrace = 6 * time.Second

// startNodeLifecycle runs kube-controller-manager v1.37.2 with only its
// node lifecycle controller (the one that marks a silent node's Ready
// condition Unknown), on a short grace period.
func (r *rig) startNodeLifecycle() {
	t := r.t
	t.Helper()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := r.s.Cluster.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	out := &testsupport.SyncBuffer{}
	kcm, err := stack.StartKubeControllerManager(r.ctx, stack.KubeControllerManagerConfig{
		Name: "kube-controller-manager-nodelifecycle", Kubeconfig: kubeconfig, Output: out,
		Controllers: []string{"nodelifecycle"},
		Args:        []string{"--node-monitor-grace-period=" + nodeMonitorGrace.String(), "--node-monitor-period=1s"},
	})
	if err != nil {
		t.Fatalf("kube-controller-manager (nodelifecycle): %v\n%s", err, tail(out.String(), 40))
	}
	t.Cleanup(func() {
		if err := kcm.Stop(); err != nil {
			t.Logf("kube-controller-manager: %v", err)
		}
		if t.Failed() {
			t.Logf("kube-controller-manager log (tail):\n%s", tail(out.String(), 60))
		}
	})
}

// killAndWaitNotReady kills n's kubelet (SIGKILL) and waits until the node
// lifecycle controller marks the Node not Ready; it returns when.
func (r *rig) killAndWaitNotReady(n *node) time.Time {
	r.t.Helper()
	if err := n.KillKubelet(); err != nil {
		r.t.Fatal(err)
	}
	var at time.Time
	testsupport.Eventually(r.t, r.ctx, nodeMonitorGrace+30*time.Second, "Node "+n.Name+" NotReady", func(ctx context.Context) (bool, error) {
		no, err := r.client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		at = time.Now()
		return !kube.NodeReady(no), nil
	})
	return at
}

// runningOnKilledNode starts the rig's world with kube-controller-manager's
// node lifecycle controller, a node and a Pod with a mounted volume, then
// kills the kubelet, waits for NotReady and deletes the Pod: it stays
// terminating (no kubelet confirms it) with its container reported
// running, and its volume stays attached for twice maxWait; then it
// force-deletes the Pod. It returns the node, the volume and when the
// Pod's force-deletion was requested.
func runningOnKilledNode(t *testing.T, maxWait time.Duration, cfg func(*controller.Config)) (*rig, *node, string, time.Time) {
	r := newRig(t, 5*time.Minute, rigOptions{Mock: slowPublishAndUnstage, Controller: func(c *controller.ServeConfig) { cfg(&c.Controller) }})
	r.startNodeLifecycle()
	n := r.addNode("a", 0)
	vol := r.volume("vol")
	r.pod("app", n, vol)
	r.waitPodRunning("app", 90*time.Second)
	r.checkAttach(vol, n, "app")
	r.killAndWaitNotReady(n)
	r.deletePod("app")
	// The Pod's status still reports its container running (the dead
	// kubelet cannot say otherwise): the Pod is not terminated, its
	// volume stays desired and nothing is detached, whatever the
	// timeout — upstream's IsPodTerminated reads it the same way.
	r.consistently("volume kept while the terminating Pod's container is reported running", 2*maxWait, func(ctx context.Context) (string, error) {
		va, ok, err := r.getVA(ctx, vol, n)
		if err == nil && (!ok || va.DeletionTimestamp != nil) {
			return "VolumeAttachment deleted", nil
		}
		return "", err
	})
	// What an operator (or the Pod GC on an out-of-service node) does:
	// force-delete the Pod. Only now does the volume leave the desired
	// state. The time is taken before the request: the controller can
	// see the Pod gone before the request returns, and long before
	// waitPodGone's poll does.
	requested := time.Now()
	if err := r.client.CoreV1().Pods(r.ns).Delete(r.ctx, "app", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	r.waitPodGone("app", 10*time.Second)
	return r, n, vol, requested
}

// TestKubeletKilled_forcedDetachAfterMaxWaitForUnmount: a node's kubelet is
// killed with a volume mounted; the node goes NotReady and the Pod is
// deleted, later force-deleted (see runningOnKilledNode). The volume
// stays attached for --max-wait-for-unmount after that, then the
// detach is forced: the VolumeAttachment is deleted while the Node still
// lists the volume in volumesInUse, without NodeUnpublish/NodeUnstage,
// and ControllerUnpublish follows the deletion.
func TestKubeletKilled_forcedDetachAfterMaxWaitForUnmount(t *testing.T) {
	const maxWait = 5 * time.Second
	r, n, vol, deleted := runningOnKilledNode(t, maxWait, func(c *controller.Config) { c.MaxWaitForUnmount = maxWait })
	r.consistently("volume attached before --max-wait-for-unmount", maxWait-time.Second, func(ctx context.Context) (string, error) {
		va, ok, err := r.getVA(ctx, vol, n)
		if err == nil && (!ok || va.DeletionTimestamp != nil) {
			return "VolumeAttachment deleted", nil
		}
		return "", err
	})
	r.waitDetached(vol, n, maxWait+30*time.Second)
	va := r.vaName(vol, n)
	deleting := r.hist.mustFirst(t, "VolumeAttachment "+va+" deleted", vaNamed(va, func(va *storagev1.VolumeAttachment) bool { return va.DeletionTimestamp != nil }))
	if waited := deleting.Observed.Sub(deleted); waited < maxWait {
		t.Errorf("detach forced %s after the Pod's force-deletion, before --max-wait-for-unmount (%s)", waited, maxWait)
	}
	no, err := r.client.CoreV1().Nodes().Get(r.ctx, n.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !inUse(no, kubenames.UniqueVolumeName(testDriver, vol)) {
		t.Errorf("Node %s no longer lists %s in volumesInUse: the dead kubelet cannot have removed it", n.Name, vol)
	}
	calls := r.s.Driver.Calls()
	for _, m := range []string{"NodeUnpublishVolume", "NodeUnstageVolume"} {
		if c, ok := findNodeCall(calls, m, vol, n.id, codes.OK); ok {
			t.Errorf("%s of %s on the killed node's endpoint: %+v", m, vol, c)
		}
	}
	cu, _ := findNodeCall(calls, "ControllerUnpublishVolume", vol, n.id, codes.OK)
	if cu.Start.Before(deleting.Obj.(*storagev1.VolumeAttachment).DeletionTimestamp.Time) {
		t.Errorf("ControllerUnpublish (%s) before the VolumeAttachment's deletion", stamp(cu.Start))
	}
	t.Logf("Pod force-deleted %s, VolumeAttachment deleted %s (RV %d, forced after %s), ControllerUnpublish %s", stamp(deleted),
		stamp(deleting.Observed), deleting.RV, deleting.Observed.Sub(deleted).Round(time.Millisecond), stamp(cu.Start))
}

// TestKubeletKilled_forceDetachDisabledKeepsVolumeAttached: as above with
// --disable-force-detach-on-timeout: the volume stays attached well past
// --max-wait-for-unmount after the force-deletion. When the kubelet comes
// back it unmounts the deleted Pod's volume (found on disk) and the detach
// follows in checkDetach's order.
func TestKubeletKilled_forceDetachDisabledKeepsVolumeAttached(t *testing.T) {
	const maxWait = 2 * time.Second
	r, n, vol, _ := runningOnKilledNode(t, maxWait, func(c *controller.Config) {
		c.MaxWaitForUnmount, c.DisableForceDetachOnTimeout = maxWait, true
	})
	r.consistently("volume attached well past --max-wait-for-unmount", 4*maxWait, func(ctx context.Context) (string, error) {
		va, ok, err := r.getVA(ctx, vol, n)
		if err == nil && (!ok || va.DeletionTimestamp != nil) {
			return "VolumeAttachment deleted", nil
		}
		return "", err
	})
	if _, ok := findNodeCall(r.s.Driver.Calls(), "ControllerUnpublishVolume", vol, n.id, codes.OK); ok {
		t.Fatalf("ControllerUnpublish of %s with force detach disabled", vol)
	}
	if err := n.StartKubelet(r.ctx); err != nil {
		t.Fatal(err)
	}
	r.waitDetached(vol, n, 2*time.Minute)
	r.checkDetach(vol, n)
	testsupport.Eventually(t, r.ctx, 30*time.Second, "Node "+n.Name+" Ready again", func(ctx context.Context) (bool, error) {
		no, err := r.client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		return err == nil && kube.NodeReady(no), err
	})
}
