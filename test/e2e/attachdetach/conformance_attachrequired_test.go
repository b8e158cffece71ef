package attachdetach_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/latchcsi/latch/internal/attachdetach/controller"
	"github.com/latchcsi/latch/internal/localcluster"
)

// upstream: populator TestFindAndRemoveNonattachableVolumes. The driver
// of an attached, mounted volume turns to attachRequired=false (the field
// is immutable: the CSIDriver object is created, or re-created, with
// false). kube-controller-manager drops the volume from its desired
// state; its reconciler then treats it as any attached volume no Pod
// wants: on a Ready node it waits while the node reports the volume in
// use, and once the kubelet no longer does, removes it from the node's
// volumesAttached and then deletes the VolumeAttachment. latch does the
// same and does not attach it again. On the real kubelet: the volume
// stays mounted (and in use) while its Pod runs, and is unmounted when
// the Pod is deleted; the detach follows in the kubelet's order.
func TestCSIDriverChange_attachRequiredFalse_attachedVolumeDetachedOnceUnmounted(t *testing.T) {
	e := newRealKubeletEnv(t, controller.Config{Workers: 4})
	node, pv, _ := e.runningPod("nolonger")
	e.waitNodeAttached(node, e.unique(pv))
	e.eventually("volume in use on "+node, func() (bool, error) {
		return slices.Contains(e.node(node).Status.VolumesInUse, e.unique(pv)), nil
	})
	if _, err := e.client.StorageV1().CSIDrivers().Create(e.ctx, localcluster.NewCSIDriver(e.driver, ptr.To(false)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.client.StorageV1().CSIDrivers().Delete(context.WithoutCancel(e.ctx), e.driver, metav1.DeleteOptions{})
	})
	e.consistently("volume attached while the node reports it in use", 2*time.Second, func() (bool, error) {
		va, ok := e.getVA(e.vaName(pv, node))
		return ok && va.DeletionTimestamp == nil && slices.Equal(attachedNames(e.node(node)), []v1.UniqueVolumeName{e.unique(pv)}), nil
	})

	// Unmounted: the Pod is deleted, the kubelet unmounts the volume and
	// no longer reports it in use.
	e.deletePod("app")
	e.waitVAGone(pv, node)
	e.waitNodeAttached(node)

	// The node status lost the volume before the VolumeAttachment was
	// deleted, and nothing was attached again.
	// The test can see the VolumeAttachment gone before the controller's
	// client has read the DELETE's answer (and recorded the write): wait
	// for the record.
	nodeStatus, vaDelete := -1, -1
	var writes []string
	e.eventually("the controller's VolumeAttachment delete recorded", func() (bool, error) {
		nodeStatus, vaDelete = -1, -1
		writes = e.controllerWrites()
		for i, w := range writes {
			switch {
			case strings.HasPrefix(w, "PATCH /api/v1/nodes/"+node+"/status"):
				nodeStatus = i
			case w == "DELETE /apis/storage.k8s.io/v1/volumeattachments/"+e.vaName(pv, node):
				vaDelete = i
			}
		}
		return vaDelete >= 0, nil
	})
	if nodeStatus < 0 || vaDelete < 0 || nodeStatus > vaDelete {
		t.Errorf("controller writes %q: want the last node status write before the VolumeAttachment delete", writes)
	}
	e.consistently("no VolumeAttachment again while attachRequired=false", time.Second, func() (bool, error) {
		_, ok := e.getVA(e.vaName(pv, node))
		return !ok, nil
	})
	if got := e.createCount(); got != 1 {
		t.Errorf("VolumeAttachment creates = %d, want 1", got)
	}
}
