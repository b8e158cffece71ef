package controller

import (
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/latchcsi/latch/internal/attachdetach/state"
)

// One Pod names volume handle "h" through an RWX PV and an RWO PV, and the
// RWO claim reaches the controller only after the volume was attached
// through the RWX PV. Once the claim is seen, the attachment is exclusive:
// a Pod on node-b using the RWX PV alone gets the Multi-Attach warning and
// no VolumeAttachment, also after the first Pod is gone and until node-a
// has detached. (Before, the attachment kept the RWX spec it was created
// with, and node-b got the volume while node-a's detach was pending.)
func TestLateRWOClaimMakesTheAttachmentExclusive_podOnAnotherNodeWaitsForTheDetach(t *testing.T) {
	pvX, pvcX := boundClaim("vol-rwx", v1.ReadWriteMany)
	pvO, pvcO := boundClaim("vol-rwo", v1.ReadWriteOnce)
	pvX.Spec.CSI.VolumeHandle, pvO.Spec.CSI.VolumeHandle = "h", "h"
	both := podUsing("both", "node-a", "vol-rwo")
	both.Spec.Volumes = append(both.Spec.Volumes, v1.Volume{Name: "shared", VolumeSource: v1.VolumeSource{
		PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: "vol-rwx"}}})
	// The RWO claim is not there yet.
	w := newFakeWorld(t, Config{Workers: 2}, managedNode("node-a"), managedNode("node-b"), pvX, pvcX, pvO, both)
	nameA, nameB, vol := upstreamVAName("h", testDriver, "node-a"), upstreamVAName("h", testDriver, "node-b"), uniqueName("h")
	w.attachedInUse(nameA, "node-a", vol)
	if va, _ := w.va(nameA); va.Spec.Source.PersistentVolumeName == nil || *va.Spec.Source.PersistentVolumeName != "vol-rwx" {
		t.Fatalf("VolumeAttachment on node-a source = %+v, want the RWX PV (the only one resolved)", va.Spec.Source)
	}

	// The RWO claim arrives; the Pod's volumes resolve again.
	if err := w.tracker.Add(pvcO); err != nil {
		t.Fatal(err)
	}
	w.eventually("the attachment on node-a recorded as exclusive", func() bool {
		a, ok := w.c.asw.Get(state.Key{Volume: vol, Node: "node-a"})
		return ok && a.Spec != nil && !a.Spec.MultiAttachAllowed()
	})
	w.settle()
	w.recorded()
	writes := len(w.writes())

	w.addPod(podUsing("other", "node-b", "vol-rwx"))
	w.eventually("the Multi-Attach warning on the Pod of node-b", func() bool {
		return slices.ContainsFunc(w.recorded(), func(e string) bool {
			return e == `Warning FailedAttachVolume Multi-Attach error for volume "vol-rwx" Volume is already used by pod(s) both`
		})
	})
	w.deletePod("both")
	w.settle()
	w.noNewWrites(writes, 300*time.Millisecond, "node-a still uses the volume")
	if _, ok := w.va(nameB); ok {
		t.Fatalf("VolumeAttachment %s created while node-a still has the volume", nameB)
	}

	// Node-a unmounts: its VolumeAttachment goes, then node-b's comes.
	w.setInUse("node-a")
	w.eventually("node-a's VolumeAttachment deleted", func() bool { _, ok := w.va(nameA); return !ok })
	w.eventually("node-b's VolumeAttachment created", func() bool { _, ok := w.va(nameB); return ok })
	got := w.writes()
	iDel, iCreate := slices.Index(got, "delete volumeattachments "+nameA), slices.Index(got, "create volumeattachments "+nameB)
	if iDel < 0 || iCreate < iDel {
		t.Errorf("writes %q: want node-a's VolumeAttachment deleted before node-b's is created", got)
	}
}
