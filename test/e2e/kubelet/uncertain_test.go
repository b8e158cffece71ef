package kubelet_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/kube/kubenames"
	"github.com/latchcsi/latch/internal/testsupport"
)

// TestKubeletHungNodeStageNeverDetachedWhileMounting: the kubelet's
// NodeStageVolume hangs (a rule for that node and volume) and the Pod is
// deleted meanwhile. While the stage is in flight the kubelet may have the
// volume mounted: it stays in volumesInUse, its VolumeAttachment is not
// deleted and there is no ControllerUnpublish. Then the hang is released,
// once as a reply lost after the stage happened (DeadlineExceeded: an
// uncertain mount for the kubelet) and once as a stage that succeeds late;
// either way the kubelet unstages the volume and the detach follows in
// checkDetach's order.
func TestKubeletHungNodeStageNeverDetachedWhileMounting(t *testing.T) {
	r := newRig(t, 6*time.Minute, rigOptions{Mock: slowPublishAndUnstage})
	n := r.addNode("a", 0)
	for i, tc := range []struct {
		name  string
		phase csimock.Phase
		code  codes.Code
	}{
		{"staged, reply lost (DeadlineExceeded)", csimock.PhaseAfter, codes.DeadlineExceeded},
		{"stage succeeds late", csimock.PhaseBefore, codes.OK},
	} {
		vol := r.volume("vol-" + string(rune('a'+i)))
		pod := "app-" + string(rune('a'+i))
		unique := kubenames.UniqueVolumeName(testDriver, vol)
		hang, err := r.s.Driver.AddFault(csimock.Rule{Method: "NodeStageVolume", NodeID: n.id, VolumeID: vol, Phase: tc.phase, Hang: true, Code: tc.code})
		if err != nil {
			t.Fatal(err)
		}
		r.pod(pod, n, vol)
		testsupport.Eventually(t, r.ctx, 90*time.Second, tc.name+": NodeStage of "+vol+" hanging", func(context.Context) (bool, error) {
			for _, c := range r.s.Driver.NodeCalls(n.id) {
				if c.Method == "NodeStageVolume" && c.VolumeID == vol && !c.Done() {
					return true, nil
				}
			}
			return false, nil
		}, r.dumpCalls)
		r.deletePod(pod)
		r.consistently(tc.name+": volume kept attached and in use while NodeStage hangs", 6*time.Second, func(ctx context.Context) (string, error) {
			va, ok, err := r.getVA(ctx, vol, n)
			if err != nil {
				return "", err
			}
			if !ok || va.DeletionTimestamp != nil {
				return "VolumeAttachment gone or deleted", nil
			}
			if _, unpublished := findNodeCall(r.s.Driver.Calls(), "ControllerUnpublishVolume", vol, n.id, codes.OK); unpublished {
				return "ControllerUnpublish done", nil
			}
			no, err := r.client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				return "", err
			}
			if !inUse(no, unique) {
				return vol + " not in Node " + n.Name + "'s volumesInUse", nil
			}
			return "", nil
		})
		// The kubelet may remove the Pod object while the stage is still
		// in flight: only volumesInUse keeps the detach back then.
		if gone, ok := r.hist.first(func(c change) bool {
			return c.Type == watch.Deleted && podNamed(pod, func(*v1.Pod) bool { return true })(c)
		}); ok {
			t.Logf("%s: Pod %s removed by the kubelet while NodeStage hung (%s); the volume stayed attached", tc.name, pod, gone)
		}
		if !r.s.Driver.ReleaseHang(hang) {
			t.Fatalf("%s: hang rule %s gone before its release", tc.name, hang)
		}
		released := time.Now()
		r.waitPodGone(pod, 2*time.Minute)
		r.waitDetached(vol, n, 2*time.Minute)
		d := r.checkDetach(vol, n)
		if d.unstage.Start.Before(released) {
			t.Errorf("%s: NodeUnstage of %s (%s) before the hung NodeStage was released (%s)", tc.name, vol, stamp(d.unstage.Start), stamp(released))
		}
		if c, ok := r.hist.first(podNamed(pod, func(p *v1.Pod) bool { return p.Status.Phase == v1.PodRunning })); ok {
			t.Errorf("%s: Pod %s Running without its volume staged: %s", tc.name, pod, c)
		}
		t.Logf("%s: released %s, NodeUnstage %s–%s, VA deleted RV %d, ControllerUnpublish %s", tc.name, stamp(released),
			stamp(d.unstage.Start), stamp(d.unstage.End), d.deleting.RV, stamp(d.ctrlUnpublish.Start))
	}
}
