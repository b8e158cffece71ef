package attachdetach_test

import (
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/attachdetach/controller"
	"github.com/latchcsi/latch/internal/testsupport/kubeletorder"
)

// The Node object of a node whose Pod runs with its volume is deleted
// while its kubelet is down; the kubelet starts again and registers the
// Node anew. The Pod runs on and its volume must stay attached
// throughout: no ControllerUnpublish, the same VolumeAttachment, the
// volume listed in the new Node's status. Then the Pod is deleted and the
// volume detached, after the kubelet unmounted it. (The race in which a
// key pass runs before the Pod is recorded again, which this flow did not
// hit in 5 runs without the guard, is reproduced with a slowed Pod pass
// by the controller package's
// TestNodeDeletedAndRegisteredAgain_runningPodsVolumeIsNotDetachedWhileItsPodIsRecordedAgain.)
func TestNodeDeletedAndRegisteredAgainByItsKubelet_runningPodKeepsItsVolume(t *testing.T) {
	e := newRealKubeletEnv(t, controller.Config{Workers: 4})
	node := e.addNode("n1")
	pv := e.volume("data", rwo())
	e.pod("app", node, pv)
	before := e.waitAttachedVA(pv, node)
	e.waitNodeAttached(node, e.unique(pv))
	e.waitPodRunning("app")

	e.stopKubeletOf(node)
	if err := e.client.CoreV1().Nodes().Delete(e.ctx, node, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.eventually("Node "+node+" deleted", func() (bool, error) {
		_, err := e.client.CoreV1().Nodes().Get(e.ctx, node, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err := e.real.nodes[node].StartKubelet(e.ctx); err != nil {
		t.Fatal(err)
	}
	e.eventually("Node "+node+" registered again with the volume in use", func() (bool, error) {
		n, err := e.client.CoreV1().Nodes().Get(e.ctx, node, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil && kubeletorder.InUse(n, e.unique(pv)), err
	})
	e.waitNodeAttached(node, e.unique(pv))
	if after, ok := e.getVA(e.vaName(pv, node)); !ok || after.UID != before.UID {
		t.Errorf("the running Pod's VolumeAttachment was replaced or deleted: before uid %s, after %+v", before.UID, after)
	}
	for _, c := range e.stack.Driver.CallsTo("ControllerUnpublishVolume") {
		if c.VolumeID == pv {
			t.Errorf("ControllerUnpublish of %s (#%d) under its running Pod", pv, c.ID)
		}
	}
	e.waitPodRunning("app")

	e.deletePod("app")
	e.waitPodGone("app")
	e.waitVAGone(pv, node)
	e.waitNodeAttached(node)
}
