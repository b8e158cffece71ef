package bench

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// TestAttachWatcherTimesAttachesAndFindsDoubleAttachments feeds the scale
// run's attachWatcher the events of a move done right (old VA gone before
// the new one is attached) and of one done wrong (both attached at once),
// and checks what the trickle and the recovery burst read from it: when a
// placement was attached and listed, whether it is detached, and which
// volumes had two attached VolumeAttachments.
func TestAttachWatcherTimesAttachesAndFindsDoubleAttachments(t *testing.T) {
	const driver = "d.csi.latch.dev"
	va := func(name, pv, node string, attached bool) *storagev1.VolumeAttachment {
		return &storagev1.VolumeAttachment{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: storagev1.VolumeAttachmentSpec{Attacher: driver, NodeName: node,
				Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv}},
			Status: storagev1.VolumeAttachmentStatus{Attached: attached},
		}
	}
	node := func(name string, pvs ...string) *v1.Node {
		n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
		for _, pv := range pvs {
			n.Status.VolumesAttached = append(n.Status.VolumesAttached, v1.AttachedVolume{Name: v1.UniqueVolumeName(uniqueNamePrefix(driver) + pv)})
		}
		return n
	}
	aw := newAttachWatcher(driver)
	// Both volumes attached on n1.
	aw.onVA(va("a1", "good", "n1", true), false)
	aw.onVA(va("b1", "bad", "n1", true), false)
	aw.onNode(node("n1", "good", "bad"), false)
	// Another driver's VA of a volume of the same name is not ours.
	other := va("x2", "good", "n2", true)
	other.Spec.Attacher = "other.csi"
	aw.onVA(other, false)

	// "good" moves right: its old VA goes (a tombstone, as after a missed
	// watch event) before the new one is attached.
	aw.onVA(cache.DeletedFinalStateUnknown{Key: "a1", Obj: va("a1", "good", "n1", true)}, true)
	aw.onNode(node("n1", "bad"), false)
	aw.onVA(va("a2", "good", "n2", false), false)
	if _, ok := aw.attachedAt(placement{"good", "n2"}); ok {
		t.Error("good on n2 counted attached before its VA is attached")
	}
	aw.onVA(va("a2", "good", "n2", true), false)
	if _, ok := aw.attachedAt(placement{"good", "n2"}); ok {
		t.Error("good on n2 counted attached before it is in n2's status")
	}
	aw.onNode(node("n2", "good"), false)
	if _, ok := aw.attachedAt(placement{"good", "n2"}); !ok {
		t.Error("good on n2 not counted attached once its VA is attached and n2 lists it")
	}
	if !aw.detached(placement{"good", "n1"}) || !aw.vaGone(placement{"good", "n1"}) {
		t.Error("good on n1 not detached after its VA went and n1 no longer lists it")
	}
	if got := aw.timesAt(placement{"good", "n2"}); got.created.IsZero() || got.attached.Before(got.created) || got.listed.Before(got.attached) || !got.gone.IsZero() {
		t.Errorf("good on n2's moments = %+v, want created <= attached <= listed, not gone", got)
	}
	if got := aw.timesAt(placement{"good", "n1"}); got.gone.IsZero() {
		t.Errorf("good on n1's moments = %+v, want gone set", got)
	}
	if aw.detached(placement{"bad", "n1"}) {
		t.Error("bad on n1 counted detached while attached")
	}

	// "bad" moves wrong: attached on n2 while still attached on n1 (its
	// VA only being deleted).
	aw.onVA(va("b2", "bad", "n2", true), false)
	if got := aw.doubleAttached(nil); len(got) != 1 || got[0] != "bad" {
		t.Errorf("double-attached volumes = %v, want [bad]", got)
	}
	if got := aw.doubleAttached(map[string]bool{"good": true}); len(got) != 0 {
		t.Errorf("double-attached among [good] = %v, want none", got)
	}
}
