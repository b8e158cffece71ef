package controller

import (
	"slices"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/latchcsi/latch/internal/attachdetach/state"
)

// TestVerify_lostWakeUps_attachAndDetachHappenAtTheNextVerifyPass loses
// every wake-up of one key on purpose (wake.lose): the Pod's pass records
// it in the desired state, but the key never runs. Neither a
// VolumeAttachment nor an actual state entry exists for the verify pass's
// other checks to find, so without the re-check of wanted keys the Pod
// would wait forever. Then the same on the way out: the Pod is deleted
// and its node stops using the volume, both wake-ups lost; the entry
// nobody wants is re-checked and detached.
func TestVerify_lostWakeUps_attachAndDetachHappenAtTheNextVerifyPass(t *testing.T) {
	pv, pvc := boundClaim("vol-1", v1.ReadWriteOnce)
	vol := uniqueName("vol-1")
	key := state.Key{Volume: vol, Node: "node-a"}
	name := upstreamVAName("vol-1", testDriver, "node-a")
	var losing atomic.Bool
	lost := atomic.Int64{}
	// VerifyPeriod 0: the test runs the pass itself.
	w := newFakeWorldWith(t, Config{Workers: 2}, func(w *fakeWorld) {
		w.c.wake.lose = func(k state.Key) bool {
			if k == key && losing.Load() {
				lost.Add(1)
				return true
			}
			return false
		}
	}, managedNode("node-a"), pv, pvc)

	losing.Store(true)
	w.addPod(podUsing("app", "node-a", "vol-1"))
	w.eventually("the Pod recorded in the desired state", func() bool { return w.c.dsw.Wants(key) && lost.Load() > 0 })
	w.noNewWrites(0, 300*time.Millisecond, "the key's wake-ups are lost")
	losing.Store(false)

	w.c.verify(w.ctx)
	if got := w.waitWrites(1); !slices.Equal(got, []string{"create volumeattachments " + name}) {
		t.Fatalf("writes after the verify pass = %q, want the create of %s", got, name)
	}
	w.attachedInUse(name, "node-a", vol)
	w.eventually("attached in the actual state", func() bool {
		st, ok := w.c.asw.StateOf(key)
		return ok && st == state.StateAttached
	})
	writes := len(w.writes())

	losing.Store(true)
	lost.Store(0)
	w.deletePod("app")
	w.eventually("the Pod gone from the desired state", func() bool { return !w.c.dsw.Wants(key) && lost.Load() > 0 })
	w.setInUseSeen("node-a")
	w.noNewWrites(writes, 300*time.Millisecond, "the key's wake-ups are lost")
	losing.Store(false)

	w.c.verify(w.ctx)
	got := w.waitWrites(writes + 2)[writes:]
	if want := []string{"patch nodes/status node-a", "delete volumeattachments " + name}; !slices.Equal(got, want) {
		t.Fatalf("writes after the verify pass = %q, want %q", got, want)
	}
}

// TestVerify_settledClusterWakesNothing: wanted, attached, in the node
// status and in use, every key settled; a verify pass wakes none of them
// (the re-checks cost nothing at rest).
func TestVerify_settledClusterWakesNothing(t *testing.T) {
	objs, _ := settledWorld(3, 4)
	var counting atomic.Bool
	woken := atomic.Int64{}
	w := newFakeWorldWith(t, Config{Workers: 2}, func(w *fakeWorld) {
		w.c.wake.lose = func(state.Key) bool {
			if counting.Load() {
				woken.Add(1)
			}
			return false
		}
	}, objs...)
	w.eventually("the start's passes done", func() bool { return w.c.wake.backlog() == 0 })
	writes := len(w.writes())
	counting.Store(true)
	w.c.verify(w.ctx)
	counting.Store(false)
	if n := woken.Load(); n != 0 {
		t.Errorf("a verify pass over a settled cluster woke %d keys, want none", n)
	}
	w.noNewWrites(writes, 200*time.Millisecond, "settled cluster")
}
