package attachdetach_test

import (
	"fmt"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/latchcsi/latch/internal/attachdetach/controller"
)

// Another client deletes the VolumeAttachment of a running Pod (the
// informer reports it; the verify pass is the net for a missed event,
// see internal/attachdetach/controller TestVerify_*): the
// controller takes the volume out of the node status, creates the
// VolumeAttachment again and lists the volume once it is attached.
func TestDrift_volumeAttachmentDeletedByAnotherClient_recreated(t *testing.T) {
	e := newEnv(t, controller.Config{Workers: 4})
	node, pv, before := e.runningPod("drift")
	e.waitNodeAttached(node, e.unique(pv))

	if err := e.client.StorageV1().VolumeAttachments().Delete(e.ctx, before.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	after := before
	e.eventually("a new VolumeAttachment attached", func() (bool, error) {
		va, ok := e.getVA(before.Name)
		after = va
		return ok && va.UID != before.UID && va.Status.Attached, nil
	})
	if after.Spec.NodeName != node || after.Spec.Source.PersistentVolumeName == nil || *after.Spec.Source.PersistentVolumeName != pv {
		t.Errorf("re-created VolumeAttachment spec = %+v", after.Spec)
	}
	// In between, the volume left the node status: the node was never told
	// "attached" for a VolumeAttachment that did not exist. The re-create
	// and the removal from the node status go through different queues, so
	// either may come first; and the test may see the re-created
	// VolumeAttachment attached (and the node status still listing the
	// volume) before the removal is written, so wait for all five writes
	// rather than for the node status.
	vaPath := "/apis/storage.k8s.io/v1/volumeattachments"
	nodePath := "/api/v1/nodes/" + node + "/status"
	want := []string{"POST " + vaPath, "PATCH " + nodePath, "PATCH " + nodePath, "POST " + vaPath, "PATCH " + nodePath}
	e.eventually(fmt.Sprintf("controller API writes %q (the middle two in either order)", want), func() (bool, error) {
		got := e.controllerWrites()
		if len(got) > len(want) {
			return false, fmt.Errorf("controller API writes:\n got %q\nwant %q (the middle two in either order)", got, want)
		}
		return len(got) == len(want) && sameMultiset(got[:2], want[:2]) && sameMultiset(got[2:4], want[2:4]) && got[4] == want[4], nil
	})
	e.waitNodeAttached(node, e.unique(pv))
	if got := e.createCount(); got != 2 {
		t.Errorf("VolumeAttachment creates = %d, want 2", got)
	}
}

// Another client empties the node's status.volumesAttached: the
// controller, its only writer, puts the volume back without touching the
// VolumeAttachment.
func TestDrift_nodeStatusEditedByAnotherClient_restored(t *testing.T) {
	e := newEnv(t, controller.Config{Workers: 4})
	node, pv, before := e.runningPod("drift")
	e.waitNodeAttached(node, e.unique(pv))
	nodePath := "/api/v1/nodes/" + node + "/status"
	attachWrites := []string{"POST /apis/storage.k8s.io/v1/volumeattachments", "PATCH " + nodePath}
	e.waitControllerWrites(attachWrites)

	if _, err := e.client.CoreV1().Nodes().Patch(e.ctx, node, types.MergePatchType,
		[]byte(`{"status":{"volumesAttached":null}}`), metav1.PatchOptions{FieldManager: "someone-else"}, "status"); err != nil {
		t.Fatal(err)
	}
	e.waitNodeAttached(node, e.unique(pv))
	va, ok := e.getVA(before.Name)
	if !ok || va.UID != before.UID || !va.Status.Attached {
		t.Errorf("VolumeAttachment changed: before uid %s, after %+v", before.UID, va)
	}
	// One node status patch puts the volume back; the VolumeAttachment is
	// not written.
	e.waitControllerWrites(append(attachWrites, "PATCH "+nodePath))
}

func sameMultiset(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	count := map[string]int{}
	for _, s := range a {
		count[s]++
	}
	for _, s := range b {
		count[s]--
	}
	for _, n := range count {
		if n != 0 {
			return false
		}
	}
	return true
}
