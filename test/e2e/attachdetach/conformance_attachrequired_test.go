package attachdetach_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
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
// same, with the Pod still running, and does not attach it again.
func TestCSIDriverChange_attachRequiredFalse_attachedVolumeDetachedOnceUnmounted(t *testing.T) {
	e := newEnv(t, controller.Config{Workers: 4})
	node, pv, _ := e.runningPod("nolonger")
	e.waitNodeAttached(node, e.unique(pv))
	e.eventually("volume in use on "+node, func() (bool, error) {
		return slices.Contains(e.node(node).Status.VolumesInUse, e.unique(pv)), nil
	})
	// The kubelet stand-in stops: the volume stays in volumesInUse (still
	// mounted) and the node stays Ready.
	e.stopKubelet()
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

	// Unmounted: the node no longer reports it in use, as the kubelet does.
	patch, _ := json.Marshal(map[string]any{"status": map[string]any{"volumesInUse": []v1.UniqueVolumeName{}}})
	if _, err := e.client.CoreV1().Nodes().Patch(e.ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
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
	if p, err := e.client.CoreV1().Pods(e.ns).Get(e.ctx, "app", metav1.GetOptions{}); err != nil || p.DeletionTimestamp != nil {
		t.Errorf("pod app: %v, deleting=%v; want it left running", err, p != nil && p.DeletionTimestamp != nil)
	}
}
