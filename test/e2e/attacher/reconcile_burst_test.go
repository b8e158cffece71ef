package attacher_test

import (
	"fmt"
	"testing"
	"time"
)

// During a detach burst every deleting VolumeAttachment is still published
// until its detach ends. The ListVolumes reconcile, running all through it,
// must not cause any volume to be unpublished twice.
func TestReconcileDuringDetachBurstUnpublishesEachVolumeOnce(t *testing.T) {
	const n = 300
	e := newEnv(t, envOptions{reconcileSync: 20 * time.Millisecond})
	name := func(i int) string { return fmt.Sprintf("%s-%03d", e.prefix, i) }
	for i := range n {
		e.createPV(name(i))
		e.createVA(e.newVA(name(i), name(i), e.node))
	}
	for i := range n {
		e.waitAttached(name(i), time.Minute)
	}
	for i := range n {
		e.deleteVA(name(i))
	}
	for i := range n {
		e.waitGone(name(i))
	}
	time.Sleep(500 * time.Millisecond) // let a late extra pass show itself
	perVolume := map[string]int{}
	for _, c := range e.driver.CallsTo(unpublishMethod) {
		perVolume[c.VolumeID]++
	}
	for v, k := range perVolume {
		if k != 1 {
			t.Errorf("volume %s unpublished %d times, want once", v, k)
		}
	}
	if len(perVolume) != n {
		t.Errorf("%d volumes unpublished, want %d", len(perVolume), n)
	}
}
