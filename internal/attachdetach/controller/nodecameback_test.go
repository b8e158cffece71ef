package controller

import (
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
)

// slowClaims is the PVC lister with a delay the test switches on: a Pod
// worker busy elsewhere (many Pods recorded again at once) takes this
// long to record a Pod, so the key passes of the node run first.
type slowClaims struct {
	corelisters.PersistentVolumeClaimLister
	slow *atomic.Bool
}

func (s slowClaims) PersistentVolumeClaims(ns string) corelisters.PersistentVolumeClaimNamespaceLister {
	if s.slow.Load() {
		time.Sleep(300 * time.Millisecond)
	}
	return s.PersistentVolumeClaimLister.PersistentVolumeClaims(ns)
}

// attachedVAOf is the attached VolumeAttachment of the PV handle on node.
func attachedVAOf(handle, node string) *storagev1.VolumeAttachment {
	pvName := handle
	return &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: upstreamVAName(handle, testDriver, node), UID: types.UID("va-uid-" + handle)},
		Spec: storagev1.VolumeAttachmentSpec{Attacher: testDriver, NodeName: node,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pvName}},
		Status: storagev1.VolumeAttachmentStatus{Attached: true},
	}
}

// A Node object deleted (kubectl delete node) and registered again by its
// kubelet, whose Pod keeps running with its volume mounted. Deleting the
// Node drops its Pods' volumes from the desired state (a deliberate
// difference from kube-controller-manager, which keeps them), and the
// registered-again Node has empty volumesAttached and volumesInUse until
// the kubelet's next status update. The Pod's volume must not be detached
// while the Pod queue records the Pod again, however late that pass
// comes; once it did, the node's other volume, which no Pod wants and
// the kubelet no longer uses, is detached.
func TestNodeDeletedAndRegisteredAgain_runningPodsVolumeIsNotDetachedWhileItsPodIsRecordedAgain(t *testing.T) {
	for range 5 {
		kept, keptClaim := boundClaim("vol-1", v1.ReadWriteOnce)
		spare, spareClaim := boundClaim("vol-2", v1.ReadWriteOnce)
		node := managedNode("node-a")
		node.Status.VolumesAttached = []v1.AttachedVolume{{Name: uniqueName("vol-1")}, {Name: uniqueName("vol-2")}}
		// vol-2 is wanted by no Pod but still in use: it waits for the
		// kubelet to unmount it.
		node.Status.VolumesInUse = []v1.UniqueVolumeName{uniqueName("vol-1"), uniqueName("vol-2")}
		keptVA, spareVA := attachedVAOf("vol-1", "node-a"), attachedVAOf("vol-2", "node-a")
		slow := &atomic.Bool{}
		w := newFakeWorldWith(t, Config{Workers: 2}, func(w *fakeWorld) {
			w.c.pvcLister = slowClaims{PersistentVolumeClaimLister: w.c.pvcLister, slow: slow}
		}, node, kept, keptClaim, spare, spareClaim, podUsing("app", "node-a", "vol-1"), keptVA, spareVA)
		w.settle()
		startWrites := len(w.writes())
		if _, ok := w.va(spareVA.Name); !ok {
			t.Fatalf("vol-2, still in the node's volumesInUse, detached at start: writes %q", w.writes())
		}

		if err := w.tracker.Delete(nodeResource, "", "node-a"); err != nil {
			t.Fatal(err)
		}
		w.eventually("the Node's deletion seen", func() bool {
			_, err := w.c.nodeLister.Get("node-a")
			return apierrors.IsNotFound(err)
		})
		w.settle()
		if _, ok := w.va(spareVA.Name); !ok {
			t.Fatalf("vol-2 detached at the Node's deletion, though its last volumesInUse lists it: writes %q", w.writes())
		}
		slow.Store(true)
		again := managedNode("node-a")
		again.UID = "node-a-uid-2"
		if err := w.tracker.Create(nodeResource, again, "", metav1.CreateOptions{FieldManager: "kubelet"}); err != nil {
			t.Fatal(err)
		}
		w.eventually("the registered-again Node seen", func() bool {
			n, err := w.c.nodeLister.Get("node-a")
			return err == nil && n.UID == again.UID
		})
		// The registered-again Node's volumesInUse is empty: vol-2 is no
		// longer used and goes, once the node's Pod is recorded again.
		w.eventually("vol-2's VolumeAttachment deleted once the Pod is recorded again", func() bool { _, ok := w.va(spareVA.Name); return !ok })
		w.settle()
		writes := w.writes()[startWrites:]
		if slices.ContainsFunc(writes, func(s string) bool { return strings.HasPrefix(s, "delete volumeattachments "+keptVA.Name) }) {
			t.Fatalf("the VolumeAttachment of vol-1, mounted by the running Pod app, was deleted: writes %q", writes)
		}
		if va, ok := w.va(keptVA.Name); !ok || va.UID != keptVA.UID {
			t.Fatalf("vol-1's VolumeAttachment = %v (exists %v), want the original %s kept", va, ok, keptVA.UID)
		}
		w.eventually("vol-1 listed in the registered-again Node's status", func() bool {
			n, err := w.c.nodeLister.Get("node-a")
			return err == nil && slices.ContainsFunc(n.Status.VolumesAttached, func(a v1.AttachedVolume) bool { return a.Name == uniqueName("vol-1") })
		})
		if n := w.c.returning.pending("node-a"); n != 0 {
			t.Fatalf("%d Pods of node-a still pending after their passes", n)
		}
	}
}
