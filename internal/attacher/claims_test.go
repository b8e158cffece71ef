package attacher

import (
	"slices"
	"testing"
)

type wakeLog struct{ woken []string }

func (w *wakeLog) wake(dir direction, name string) {
	w.woken = append(w.woken, map[direction]string{attachDir: "attach/", detachDir: "detach/"}[dir]+name)
}

func TestClaims_aBlockedPassIsWokenByTheRelease(t *testing.T) {
	var log wakeLog
	c := newClaims(log.wake)
	if !c.claim(detachDir, "va-1") {
		t.Fatal("first claim of va-1 refused")
	}
	if c.claim(attachDir, "va-1") {
		t.Fatal("attach claimed va-1 while the detach owns it")
	}
	if !c.claim(attachDir, "va-2") {
		t.Fatal("another VolumeAttachment is not claimed by va-1's owner")
	}
	if len(log.woken) != 0 {
		t.Fatalf("woken before any release: %v", log.woken)
	}
	c.release("va-1")
	if want := []string{"attach/va-1"}; !slices.Equal(log.woken, want) {
		t.Fatalf("woken %v, want %v", log.woken, want)
	}
	// The waiter runs now and owns it; a second release wakes nobody.
	if !c.claim(attachDir, "va-1") {
		t.Fatal("the woken attach cannot claim va-1")
	}
	c.release("va-1")
	c.release("va-2")
	if len(log.woken) != 1 {
		t.Fatalf("woken %v, want only the one waiter", log.woken)
	}
}

func TestClaims_bothDirectionsWaitingAreBothWoken(t *testing.T) {
	var log wakeLog
	c := newClaims(log.wake)
	c.claim(attachDir, "va")
	c.claim(attachDir, "va") // the same key again (a resync)
	c.claim(detachDir, "va")
	c.release("va")
	if want := []string{"attach/va", "detach/va"}; !slices.Equal(log.woken, want) {
		t.Fatalf("woken %v, want %v", log.woken, want)
	}
}
