// Package kubelet_test runs latch's attach/detach controller and
// csi-attacher with the real kubelet (hollow-kubelet: Kubernetes v1.37.2's
// kubelet with kubemark's fake container runtime and fake mounter) on one
// node instead of the kubelet stand-in, and the mock CSI driver's node
// plugin registered with that kubelet. It asserts the contract the
// controller's safety rests on, from the mock's call log and the API's
// history: mount only after attach, detach only after unmount.
package kubelet_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	v1 "k8s.io/api/core/v1"

	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/kube/kubenames"
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
	r := newRig(t, 4*time.Minute, rigOptions{Mock: slowPublishAndUnstage})
	n := r.addNode("a", 0)
	// The kubelet notifies the plugin after it registered it.
	testsupport.Eventually(t, r.ctx, 10*time.Second, "the kubelet notifies the registration's success", func(context.Context) (bool, error) {
		st := n.Endpoint.Registration()
		if st.Notified && (!st.Registered || st.Error != "" || st.InfoCalls == 0) {
			t.Fatalf("registration status %+v: want GetInfo called and the kubelet's success notified", st)
		}
		return st.Notified, nil
	})
	if c, ok := lastCall(r.s.Driver.NodeCalls(n.id), "NodeGetInfo"); !ok || c.Code != codes.OK {
		t.Fatalf("the kubelet asked no NodeGetInfo on the node socket: %+v", r.s.Driver.NodeCalls(n.id))
	}
	t.Logf("node %s Ready, driver registered after %s", n.Name, time.Since(start).Round(time.Millisecond))

	// Attach and mount.
	vol := r.volume("vol")
	r.pod("app", n, vol)
	r.waitPodRunning("app", 90*time.Second)
	t.Logf("Pod Running after %s", time.Since(start).Round(time.Millisecond))
	a := r.checkAttach(vol, n, "app")
	unique := kubenames.UniqueVolumeName(testDriver, vol)
	inUseAdded := r.hist.mustFirst(t, "volume in Node "+n.Name+"'s volumesInUse", nodeNamed(n.Name, func(no *v1.Node) bool { return inUse(no, unique) }))
	if a.attached.RV < inUseAdded.RV {
		t.Logf("note: the VolumeAttachment was attached (RV %d) before the kubelet reported the volume in use (RV %d)", a.attached.RV, inUseAdded.RV)
	}
	if nv := r.s.Driver.NodeVolumes(n.id); nv.Staged[vol] == "" || len(nv.Published[vol]) != 1 {
		t.Errorf("node %s's volumes while the Pod runs: %+v, want %s staged and published once", n.id, nv, vol)
	}

	// Unmount and detach.
	r.deletePod("app")
	r.waitPodGone("app", 2*time.Minute)
	r.waitDetached(vol, n, 2*time.Minute)
	t.Logf("Pod deleted, volume detached after %s", time.Since(start).Round(time.Millisecond))
	d := r.checkDetach(vol, n)
	if got := r.s.Driver.Published(vol); len(got) != 0 {
		t.Errorf("volume %s still published to %v", vol, got)
	}
	t.Logf("order: ControllerPublish %s, NodeStage %s, NodePublish %s, Pod Running RV %d (VA attached RV %d); NodeUnpublish %s, NodeUnstage %s–%s, last in volumesInUse RV %d, VA deleted RV %d, ControllerUnpublish %s",
		stamp(a.publish.End), stamp(a.stage.Start), stamp(a.nodePublish.Start), a.running.RV, a.attached.RV,
		stamp(d.unpublish.Start), stamp(d.unstage.Start), stamp(d.unstage.End), d.lastInUse.RV, d.deleting.RV, stamp(d.ctrlUnpublish.Start))
}

// slowPublishAndUnstage adds the delays that make ordering bugs visible:
// see publishDelay and unstageDelay.
func slowPublishAndUnstage(c *csimock.Config) {
	c.Faults = append(c.Faults,
		csimock.Rule{ID: "slow-publish", Method: "ControllerPublishVolume", Latency: publishDelay},
		csimock.Rule{ID: "slow-unstage", Method: "NodeUnstageVolume", Latency: unstageDelay})
}

func stamp(t time.Time) string { return t.Format("15:04:05.000") }

func tail(s string, lines int) string {
	l := strings.Split(s, "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}
