package reliability_test

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/attachdetach/controller"
	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/stack"
)

// TestRealKubelet_apiServerRestartMidBurst_everyAttachAndDetachInOrder is
// TestAPIServerRestart_duringBurstOfAttachesAndDetaches on real kubelets:
// two hollow nodes, ten volumes. The first half is attached and mounted
// (Pods Running); then the second half's Pods are created and the first
// half's deleted, and the API server restarts in the middle of that
// burst, once csi-attacher has started publishing the new volumes. The hollow kubelets, the controller, csi-attacher and the API
// history all talk to the same address and carry on. Every Pod ran with
// its attach passing CheckAttach, every deleted Pod's volume was
// unmounted before its detach (CheckDetach), and once the second half is
// deleted too nothing is left published, staged or listed.
func TestRealKubelet_apiServerRestartMidBurst_everyAttachAndDetachInOrder(t *testing.T) {
	w := newKubeletWorld(t, controller.Config{}, 2)
	const n = 10
	pvs := w.volumes(n)
	node := func(i int) string { return w.nodes[i%len(w.nodes)] }
	for i := range n / 2 {
		w.mustPod(fmt.Sprintf("p%d", i), node(i), pvs[i])
	}
	for i := range n / 2 {
		w.waitRunning(fmt.Sprintf("p%d", i))
	}
	w.fault(csimock.Rule{Method: "*", Latency: 50 * time.Millisecond})
	for i := n / 2; i < n; i++ {
		w.mustPod(fmt.Sprintf("p%d", i), node(i), pvs[i])
	}
	for i := range n / 2 {
		w.deletePod(fmt.Sprintf("p%d", i))
	}
	// The restart falls in the middle of the burst: csi-attacher has
	// started publishing the new volumes.
	w.eventually(60*time.Second, "a ControllerPublish of the new volumes started", func() bool {
		return len(w.mock.CallsTo("ControllerPublishVolume")) > n/2
	})
	published, unpublished, unmounted := w.countOK("ControllerPublishVolume"), w.countOK("ControllerUnpublishVolume"), w.countOK("NodeUnpublishVolume")
	endDisruption := w.disrupt("API server restarted")
	if err := cluster.RestartAPIServer(w.ctx); err != nil {
		t.Fatal(err)
	}
	endDisruption()
	restarted := time.Now()
	t.Logf("at the restart %d of %d new volumes were published, %d of %d deleted Pods' volumes unmounted and %d unpublished", published-n/2, n/2, unmounted, n/2, unpublished)
	// The kubelets talk to the same address: each writes its Node's
	// status again.
	for _, name := range w.nodes {
		w.eventually(60*time.Second, "the kubelet of "+name+" heartbeats after the API server's restart", func() bool {
			no, err := w.client.CoreV1().Nodes().Get(w.ctx, name, metav1.GetOptions{})
			if err != nil {
				return false
			}
			for _, c := range no.Status.Conditions {
				if c.Type == v1.NodeReady {
					return c.Status == v1.ConditionTrue && c.LastHeartbeatTime.After(restarted)
				}
			}
			return false
		})
	}
	for i := n / 2; i < n; i++ {
		w.waitRunning(fmt.Sprintf("p%d", i))
	}
	for i := range n / 2 {
		w.waitGone(pvs[i], node(i))
		w.waitPodGone(fmt.Sprintf("p%d", i))
	}
	w.mock.ClearFaults()
	for i := range n {
		w.order.CheckAttach(t, pvs[i], node(i), stack.NodeID(node(i)), fmt.Sprintf("p%d", i))
	}
	for i := n / 2; i < n; i++ {
		w.deletePod(fmt.Sprintf("p%d", i))
	}
	for i := n / 2; i < n; i++ {
		w.waitGone(pvs[i], node(i))
		w.waitPodGone(fmt.Sprintf("p%d", i))
	}
	w.checkNothingLeft(time.Minute)
	if got := w.checkDetaches(); got != n {
		t.Errorf("%d detaches checked, want %d", got, n)
	}
}

// countOK counts the driver's calls of method that ended OK.
func (w *kubeletWorld) countOK(method string) int {
	n := 0
	for _, c := range w.mock.CallsTo(method) {
		if c.Done() && c.Code == codes.OK {
			n++
		}
	}
	return n
}

// TestRealKubelet_controllerKilledMidAttachAndMidDetach_orderHolds is
// TestControllerKilled_midAttachAndMidDetach_newInstanceFinishesTheWork
// on real kubelets: two hollow nodes, six volumes. With ControllerPublish
// slow (300 ms), the attach/detach controller is killed (its network cut,
// then stopped; a new instance starts) while the first publish is in
// flight: every Pod runs, and no kubelet stages or publishes a volume
// before its attach (CheckAttach). Then, with ControllerUnpublish slow,
// every Pod is deleted and the controller killed again while the first
// unpublish is in flight: every volume is unmounted before its detach
// (CheckDetach), no volume is published to two nodes, and nothing is
// left.
func TestRealKubelet_controllerKilledMidAttachAndMidDetach_orderHolds(t *testing.T) {
	w := newKubeletWorld(t, controller.Config{}, 2)
	const n = 6
	pvs := w.volumes(n)
	node := func(i int) string { return w.nodes[i%len(w.nodes)] }
	w.fault(csimock.Rule{Method: "ControllerPublishVolume", Latency: 300 * time.Millisecond})
	for i := range n {
		w.mustPod(fmt.Sprintf("p%d", i), node(i), pvs[i])
	}
	w.eventually(30*time.Second, "the first ControllerPublish in flight", func() bool { return w.anyInFlight("ControllerPublishVolume") })
	w.killController()
	t.Logf("controller killed with %d of %d volumes published", w.countOK("ControllerPublishVolume"), n)
	for i := range n {
		w.waitRunning(fmt.Sprintf("p%d", i))
	}
	for i := range n {
		w.order.CheckAttach(t, pvs[i], node(i), stack.NodeID(node(i)), fmt.Sprintf("p%d", i))
	}

	w.mock.ClearFaults()
	w.fault(csimock.Rule{Method: "ControllerUnpublishVolume", Latency: 300 * time.Millisecond})
	for i := range n {
		w.deletePod(fmt.Sprintf("p%d", i))
	}
	w.eventually(60*time.Second, "the first ControllerUnpublish in flight", func() bool { return w.anyInFlight("ControllerUnpublishVolume") })
	w.killController()
	t.Logf("controller killed with %d of %d volumes unpublished", w.countOK("ControllerUnpublishVolume"), n)
	for i := range n {
		w.waitGone(pvs[i], node(i))
		w.waitPodGone(fmt.Sprintf("p%d", i))
	}
	w.mock.ClearFaults()
	if p := w.mock.Stats().Publish; p.SingleNodeViolationsTotal != 0 {
		t.Errorf("a ReadWriteOnce volume was published to two nodes at once: %+v", p.SingleNodeViolations)
	}
	w.checkNothingLeft(time.Minute)
	if got := w.checkDetaches(); got != n {
		t.Errorf("%d detaches checked, want %d", got, n)
	}
}

// anyInFlight reports whether a call of method is in the driver.
func (w *kubeletWorld) anyInFlight(method string) bool {
	for _, c := range w.mock.CallsTo(method) {
		if !c.Done() {
			return true
		}
	}
	return false
}
