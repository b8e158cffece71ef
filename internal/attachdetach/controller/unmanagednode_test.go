package controller

import (
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// A node whose kubelet attaches its own volumes
// (--enable-controller-attach-detach=false: no controller-managed
// annotation). Its kubelet creates the VolumeAttachment of a Pod's volume
// itself, before its next node status lists the volume in volumesInUse
// (the kubelet attaches without waiting for "reported in use" when it
// attaches itself). The attach/detach controller does not manage this
// node and must leave the kubelet's VolumeAttachment alone.
func TestUnmanagedNode_kubeletsOwnVolumeAttachmentIsLeftAlone(t *testing.T) {
	pv, pvc := boundClaim("vol-1", v1.ReadWriteOnce)
	node := managedNode("node-a")
	delete(node.Annotations, kubenames.ControllerManagedAttachAnnotation)
	w := newFakeWorld(t, Config{Workers: 2}, node, pv, pvc, podUsing("app", "node-a", "vol-1"))
	w.settle()

	// The kubelet of node-a attaches the volume for its Pod.
	pvName := "vol-1"
	va := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: upstreamVAName("vol-1", testDriver, "node-a"), UID: "kubelet-va"},
		Spec: storagev1.VolumeAttachmentSpec{Attacher: testDriver, NodeName: "node-a",
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pvName}},
	}
	if err := w.tracker.Create(vaResource, va, "", metav1.CreateOptions{FieldManager: "kubelet"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	w.settle()
	for _, wr := range w.writes() {
		if strings.HasPrefix(wr, "delete volumeattachments") {
			t.Fatalf("controller deleted the kubelet's VolumeAttachment on an unmanaged node: writes %q", w.writes())
		}
	}
	if got := w.writes(); len(got) != 0 {
		t.Fatalf("controller writes for a node it does not manage: %q, want none", got)
	}
	if _, ok := w.va(va.Name); !ok {
		t.Fatal("the kubelet's VolumeAttachment is gone")
	}
}
