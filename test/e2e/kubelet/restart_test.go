package kubelet_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"

	"github.com/latchcsi/latch/internal/kube/kubenames"
	"github.com/latchcsi/latch/internal/testsupport"
)

// TestKubeletRestartReconstructsVolumes: the kubelet of a node whose Pod
// runs with a mounted volume is restarted (SIGTERM, then a new
// hollow-kubelet with the same name and root directory; the driver's node
// plugin keeps serving), twice. The new kubelet reconstructs the volume
// from its root directory: no NodeUnpublish, NodeUnstage or
// ControllerUnpublish of it, no VolumeAttachment deletion, the volume
// never leaves the Node's volumesInUse, and the Pod's phase stays Running.
// Deleting the Pod afterwards detaches it in checkDetach's order.
func TestKubeletRestartReconstructsVolumes(t *testing.T) {
	r := newRig(t, 5*time.Minute, rigOptions{Mock: slowPublishAndUnstage})
	n := r.addNode("a", 0)
	vol := r.volume("vol")
	r.pod("app", n, vol)
	r.waitPodRunning("app", 90*time.Second)
	a := r.checkAttach(vol, n, "app")
	unique := kubenames.UniqueVolumeName(testDriver, vol)
	va := r.vaName(vol, n)

	for i := range 2 {
		before := len(r.s.Driver.Calls())
		infoCalls := n.Endpoint.Registration().InfoCalls
		if err := n.StopKubelet(); err != nil {
			t.Fatalf("restart %d: stop the kubelet: %v", i, err)
		}
		if err := n.StartKubelet(r.ctx); err != nil {
			t.Fatalf("restart %d: %v", i, err)
		}
		restarted := time.Now()
		// The new kubelet finds the registration socket again and asks
		// NodeGetInfo: it is up and has the driver.
		testsupport.Eventually(t, r.ctx, 60*time.Second, "the restarted kubelet registers the driver again", func(context.Context) (bool, error) {
			return n.Endpoint.Registration().InfoCalls > infoCalls, nil
		}, r.dumpCalls)
		// Past several node status updates (every 2 s) and volume manager
		// syncs of the new kubelet.
		r.consistently(fmt.Sprintf("restart %d: VolumeAttachment kept, volume in use, Pod Running", i), 8*time.Second, func(ctx context.Context) (string, error) {
			got, ok, err := r.getVA(ctx, vol, n)
			if err != nil {
				return "", err
			}
			if !ok || got.DeletionTimestamp != nil || !got.Status.Attached {
				return "VolumeAttachment " + va + " gone, deleted or not attached", nil
			}
			p, ok, err := r.getPod(ctx, "app")
			if err == nil && (!ok || p.Status.Phase != v1.PodRunning) {
				return "Pod app gone or not Running", nil
			}
			return "", err
		})
		for _, c := range r.s.Driver.Calls()[before:] {
			if c.VolumeID != vol {
				continue
			}
			switch c.Method {
			case "NodeUnpublishVolume", "NodeUnstageVolume", "ControllerUnpublishVolume":
				t.Errorf("restart %d: %s of %s (#%d at %s) after the kubelet restart at %s", i, c.Method, vol, c.ID, stamp(c.Start), stamp(restarted))
			default:
				t.Logf("restart %d: %s of %s (#%d at %s) %s", i, c.Method, vol, c.ID, stamp(c.Start), c.CodeName)
			}
		}
	}

	// The whole time, from the first listing: never out of volumesInUse,
	// the VolumeAttachment never deleted, the Pod never out of Running.
	if c, ok := r.hist.first(after(a.running.RV, nodeNamed(n.Name, func(no *v1.Node) bool { return !inUse(no, unique) }))); ok {
		t.Errorf("volume left Node %s's volumesInUse across the kubelet restarts: %s", n.Name, c)
	}
	if c, ok := r.hist.first(vaNamed(va, func(va *storagev1.VolumeAttachment) bool { return va.DeletionTimestamp != nil })); ok {
		t.Errorf("VolumeAttachment deleted across the kubelet restarts: %s", c)
	}
	if c, ok := r.hist.first(after(a.running.RV, podNamed("app", func(p *v1.Pod) bool { return p.Status.Phase != v1.PodRunning }))); ok {
		t.Errorf("Pod app left Running across the kubelet restarts: %s (phase %s)", c, c.Obj.(*v1.Pod).Status.Phase)
	}

	r.deletePod("app")
	r.waitPodGone("app", 2*time.Minute)
	r.waitDetached(vol, n, 2*time.Minute)
	r.checkDetach(vol, n)
}
