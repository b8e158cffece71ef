package attacher

import (
	"slices"
	"testing"

	storagev1 "k8s.io/api/storage/v1"
)

type wakeLog struct{ woken []string }

func (w *wakeLog) wake(dir direction, name string) {
	w.woken = append(w.woken, map[direction]string{attachDir: "attach/", detachDir: "detach/"}[dir]+name)
}

func TestRoute_aBlockedPassIsWokenByTheRelease(t *testing.T) {
	var log wakeLog
	r := newRoute(log.wake)
	if !r.take(detachDir, "va-1") {
		t.Fatal("first take of va-1 refused")
	}
	if r.take(attachDir, "va-1") {
		t.Fatal("attach took va-1 while the detach owns it")
	}
	if !r.take(attachDir, "va-2") {
		t.Fatal("another VolumeAttachment is not held by va-1's owner")
	}
	if len(log.woken) != 0 {
		t.Fatalf("woken before any release: %v", log.woken)
	}
	r.release("va-1", nowhere)
	if want := []string{"attach/va-1"}; !slices.Equal(log.woken, want) {
		t.Fatalf("woken %v, want %v", log.woken, want)
	}
	// The waiter runs now and owns it; a second release wakes nobody.
	if !r.take(attachDir, "va-1") {
		t.Fatal("the woken attach cannot take va-1")
	}
	r.release("va-1", nowhere)
	r.release("va-2", nowhere)
	if len(log.woken) != 1 {
		t.Fatalf("woken %v, want only the one waiter", log.woken)
	}
}

func TestRoute_bothDirectionsWaitingAreBothWoken(t *testing.T) {
	var log wakeLog
	r := newRoute(log.wake)
	r.take(attachDir, "va")
	r.take(attachDir, "va") // the same key again (a resync)
	r.take(detachDir, "va")
	r.release("va", nowhere)
	if want := []string{"attach/va", "detach/va"}; !slices.Equal(log.woken, want) {
		t.Fatalf("woken %v, want %v", log.woken, want)
	}
}

// A pass that finds its object belongs to the other lane does no work and
// says so; the release, not the pass, moves the name, once.
func TestRoute_thePassNamesTheNextLaneAndTheReleaseMovesTheName(t *testing.T) {
	var log wakeLog
	r := newRoute(log.wake)
	r.take(attachDir, "va")
	r.take(detachDir, "va") // the delete's event while the attach runs
	r.release("va", detachDir)
	if want := []string{"detach/va"}; !slices.Equal(log.woken, want) {
		t.Fatalf("woken %v, want %v (once)", log.woken, want)
	}
}

// A detach pass may run to its end while an attach pass of the same name
// is due: it unpublished, removed our finalizer, and the object is gone.
// The attach pass must decide on what is there once it owns the name, not
// on a read made before: publishing for the gone object would leave a
// publication nothing detaches while the attach/detach controller, seeing
// the object gone, attaches the volume to another node. The pass reads
// only once it owns the name; while the detach owns it, the pass does
// nothing and the release wakes it.
func TestAttachPass_objectGoneWhileTheDetachOwnedIt_decidesNothingAndPublishesNothing(t *testing.T) {
	pending := attachedVA("va-r", "pv-r")
	pending.Status = storagev1.VolumeAttachmentStatus{} // metadata written, publish not yet confirmed
	f := newExecFixture(t, execPV("pv-r"), pending, execCSINode())
	if !f.ctrl.route.take(detachDir, "va-r") {
		t.Fatal("the detach lane cannot take va-r")
	}
	if _, err := f.ctrl.syncAttach(f.ctx, "va-r"); err != nil {
		t.Fatalf("syncAttach while the detach owns va-r: %v", err)
	}
	f.requireCSICalls()
	if err := f.tracker.Delete(vaGVR, "", "va-r"); err != nil {
		t.Fatal(err)
	}
	f.waitFor("VA gone from the cache", func() bool { _, exists, _ := f.vaStore.GetByKey("va-r"); return !exists })
	f.ctrl.route.release("va-r", nowhere)

	// The key runs again from a fresh read: the object is gone and nothing
	// was published, so that pass does nothing either.
	if _, err := f.ctrl.syncAttach(f.ctx, "va-r"); err != nil {
		t.Fatalf("syncAttach: %v", err)
	}
	f.requireCSICalls()
	for _, vol := range f.driver.State().Volumes {
		if len(vol.Published) != 0 {
			t.Fatalf("volume %s published to %+v", vol.ID, vol.Published)
		}
	}
}
