package controller

import (
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/latchcsi/latch/internal/attachdetach/state"
)

var pvcResource = v1.SchemeGroupVersion.WithResource("persistentvolumeclaims")

// A claim deleted under a running Pod does not make its volume unwanted:
// the Pod's record keeps what the volume resolved to (as kcm's populator
// only adds volumes to a live Pod), so the volume stays in the desired
// state and its VolumeAttachment is not deleted.
func TestPodRecord_claimDeletedUnderRunningPodKeepsItsVolumeWanted(t *testing.T) {
	pv, pvc := boundClaim("disk-1", v1.ReadWriteOnce)
	w := newFakeWorld(t, Config{Workers: 2}, managedNode("node-a"), pv, pvc, podUsing("app", "node-a", "disk-1"))
	name := upstreamVAName("disk-1", testDriver, "node-a")
	w.waitWrites(1)
	w.attach(name)
	key := state.Key{Volume: uniqueName("disk-1"), Node: "node-a"}
	w.eventually("the volume attached in the actual state", func() bool {
		e, ok := w.c.asw.Get(key)
		return ok && e.State == state.StateAttached
	})

	if err := w.tracker.Delete(pvcResource, testNS, "disk-1"); err != nil {
		t.Fatal(err)
	}
	// The claim's deletion wakes the Pod; wait until the controller saw it
	// and has no Pod pass left to run.
	w.eventually("the claim gone from the controller's cache and its Pod pass done", func() bool {
		_, err := w.c.pvcLister.PersistentVolumeClaims(testNS).Get("disk-1")
		return err != nil && w.c.wake.pods.Len() == 0
	})
	rec, ok := w.c.podRec.Get(state.PodKey(testNS, "app"))
	if !ok {
		t.Fatal("the running Pod's record is gone")
	}
	if v, ok := rec.Volume("data"); !ok || v.UniqueName != key.Volume {
		t.Fatalf("the Pod's record of volume data = %+v, %v; want its earlier resolution %s", v, ok, key.Volume)
	}
	if _, wanted := w.c.dsw.Get(key); !wanted {
		t.Error("the volume left the desired state when its claim was deleted under the running Pod")
	}
	if slices.ContainsFunc(w.writes(), func(s string) bool { return strings.HasPrefix(s, "delete volumeattachments") }) {
		t.Errorf("VolumeAttachment deleted: writes %q", w.writes())
	}
}
