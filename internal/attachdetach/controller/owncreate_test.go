package controller

import (
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"github.com/latchcsi/latch/internal/attachdetach/state"
	"github.com/latchcsi/latch/internal/kube"
)

// The controller's own VolumeAttachment creates against an informer that
// lags behind them. Each test holds the informer back (missNext) and
// delivers the event itself at the moment that matters, so the
// interleaving is exact, not a matter of luck.

// informerCatchesUp stores va in the controller's VolumeAttachment
// informer cache and then runs the add handler, in the informer's order.
func (w *fakeWorld) informerCatchesUp(va *storagev1.VolumeAttachment) {
	w.t.Helper()
	if err := w.vaCache().Add(va); err != nil {
		w.t.Fatal(err)
	}
	w.c.vaChanged(nil, va)
}

// lateInformerStore is the controller's VolumeAttachment store with one
// unlucky read: the first read of name that finds nothing although the
// server already holds the object returns "not found" — the store was
// read just before the informer stored the object — and before it
// returns, the informer stores the object and runs its add handler.
type lateInformerStore struct {
	cache.Store
	w     *fakeWorld
	name  string
	fired atomic.Bool
}

func (l *lateInformerStore) GetByKey(name string) (any, bool, error) {
	obj, exists, err := l.Store.GetByKey(name)
	if name != l.name || exists || err != nil || l.fired.Load() {
		return obj, exists, err
	}
	stored, ok := l.w.va(name)
	if !ok {
		return obj, exists, err
	}
	l.fired.Store(true)
	l.w.informerCatchesUp(stored)
	return obj, exists, err
}

func TestCreate_informerShowsTheNewVolumeAttachmentBetweenAPassCacheReadAndItsOverlayRead_noSecondCreate(t *testing.T) {
	pv, pvc := boundClaim("vol-1", v1.ReadWriteOnce)
	name := upstreamVAName("vol-1", testDriver, "node-a")
	var late *lateInformerStore
	w := newFakeWorldWith(t, Config{Workers: 2}, func(w *fakeWorld) {
		// The informer gets the create's event only through the unlucky
		// read.
		w.missNext(name)
		late = &lateInformerStore{Store: w.vaCache(), w: w, name: name}
		w.c.vaCache = kube.NewOverlaidStore(late, kube.Typed[*storagev1.VolumeAttachment])
	}, managedNode("node-a"), pv, pvc, podUsing("app", "node-a", "vol-1"))

	w.waitWrites(1)
	// The create changed the actual state, which decides the key again at
	// once; that pass makes the unlucky read.
	w.eventually("a pass reading the cache just before the informer caught up", late.fired.Load)
	w.settle()
	if got := w.writes(); !slices.Equal(got, []string{"create volumeattachments " + name}) {
		t.Fatalf("controller writes = %q, want one create of %s", got, name)
	}

	w.attach(name)
	got := w.waitWrites(2)
	w.settle()
	if want := []string{"create volumeattachments " + name, "patch nodes/status node-a"}; !slices.Equal(w.writes(), want) {
		t.Fatalf("controller writes:\n got %q\nwant %q", got, want)
	}
}

func TestCreate_deleteEventOfThePreviousVolumeAttachmentArrivesAfterTheNewCreate_noSecondCreate(t *testing.T) {
	// Detach, then attach again on the same node: the new VolumeAttachment
	// has the old one's name. The informer has already dropped the old
	// object when the key creates the new one, but runs its delete
	// handler only afterwards.
	pv, pvc := boundClaim("vol-1", v1.ReadWriteOnce)
	w := newFakeWorld(t, Config{Workers: 2}, managedNode("node-a"), pv, pvc, podUsing("first", "node-a", "vol-1"))
	name := upstreamVAName("vol-1", testDriver, "node-a")
	vol := uniqueName("vol-1")
	key := state.Key{Volume: vol, Node: "node-a"}
	w.attachedInUse(name, "node-a", vol)

	old, _ := w.va(name)
	w.missNext(name) // the delete event
	w.deletePod("first")
	w.setInUse("node-a")
	w.waitWrites(4)
	w.settle()
	// A new Pod wants the volume there; the old VolumeAttachment still
	// counts as being deleted.
	w.addPod(podUsing("second", "node-a", "vol-1"))
	w.settle()
	w.noNewWrites(4, 100*time.Millisecond, "the old VolumeAttachment is still in the informer")

	// The informer drops the old object; its delete handler has not run
	// yet when a pass of the key sees the name free and creates.
	w.missNext(name) // the new object's add event
	if err := w.vaCache().Delete(old); err != nil {
		t.Fatal(err)
	}
	w.c.wake.Key(key)
	got := w.waitWrites(5)
	if got[4] != "create volumeattachments "+name {
		t.Fatalf("controller writes = %q, want the VolumeAttachment created again", got)
	}
	w.settle()
	// Now the old object's delete handler runs; it wakes the key, whose
	// new VolumeAttachment the informer still does not show.
	w.c.vaDeleted(old)
	w.settle()
	w.noNewWrites(5, 100*time.Millisecond, "the old object's delete event")

	created, ok := w.va(name)
	if !ok || created.UID == old.UID {
		t.Fatalf("stored VolumeAttachment = %+v, want a new object", created)
	}
	w.informerCatchesUp(created)
	w.attach(name)
	w.waitWrites(6)
	w.settle()
	want := []string{"create volumeattachments " + name, "patch nodes/status node-a", "patch nodes/status node-a",
		"delete volumeattachments " + name, "create volumeattachments " + name, "patch nodes/status node-a"}
	if got := w.writes(); !slices.Equal(got, want) {
		t.Fatalf("controller writes:\n got %q\nwant %q", got, want)
	}
}

func TestCreate_anotherClientDeletesTheVolumeAttachmentBeforeTheCreateReturns_createdAgain(t *testing.T) {
	pv, pvc := boundClaim("vol-1", v1.ReadWriteOnce)
	name := upstreamVAName("vol-1", testDriver, "node-a")
	var first atomic.Bool
	w := newFakeWorldWith(t, Config{Workers: 2}, func(w *fakeWorld) {
		w.client.PrependReactor("create", "volumeattachments", func(action clienttesting.Action) (bool, runtime.Object, error) {
			if !first.CompareAndSwap(false, true) {
				return w.serverCreate(action)
			}
			// The informer shows the object added and deleted by
			// someone else before the create call returns.
			w.missNext(name)
			w.missNext(name)
			handled, obj, err := w.serverCreate(action)
			if err != nil {
				return handled, obj, err
			}
			va := obj.(*storagev1.VolumeAttachment)
			if err := w.tracker.Delete(vaResource, "", name); err != nil {
				return true, nil, err
			}
			if err := w.vaCache().Add(va); err != nil {
				return true, nil, err
			}
			w.c.vaChanged(nil, va)
			if err := w.vaCache().Delete(va); err != nil {
				return true, nil, err
			}
			w.c.vaDeleted(va)
			return handled, obj, nil
		})
	}, managedNode("node-a"), pv, pvc, podUsing("app", "node-a", "vol-1"))

	if va := w.twoCreatesThenNodeStatus(name); va.UID != "uid-2" {
		t.Fatalf("stored VolumeAttachment = %+v, want the second create's", va)
	}
}

func TestCreate_serverError_retriedAndCreated(t *testing.T) {
	pv, pvc := boundClaim("vol-1", v1.ReadWriteOnce)
	name := upstreamVAName("vol-1", testDriver, "node-a")
	var calls atomic.Int32
	w := newFakeWorldWith(t, Config{Workers: 2, RetryIntervalStart: 10 * time.Millisecond}, func(w *fakeWorld) {
		w.client.PrependReactor("create", "volumeattachments", func(action clienttesting.Action) (bool, runtime.Object, error) {
			if calls.Add(1) == 1 {
				return true, nil, apierrors.NewInternalError(errors.New("etcd unavailable"))
			}
			return w.serverCreate(action)
		})
	}, managedNode("node-a"), pv, pvc, podUsing("app", "node-a", "vol-1"))

	w.twoCreatesThenNodeStatus(name)
}

func TestCreate_responseLost_theAPIServerIsAsked_noSecondCreate_thenAttaches(t *testing.T) {
	// The server stored the object but the controller got an error, so it
	// cannot know. Rather than create again (to be answered
	// AlreadyExists), the retry asks the API server and takes the object
	// it has, although the informer has not shown it.
	pv, pvc := boundClaim("vol-1", v1.ReadWriteOnce)
	name := upstreamVAName("vol-1", testDriver, "node-a")
	var calls atomic.Int32
	w := newFakeWorldWith(t, Config{Workers: 2, RetryIntervalStart: 10 * time.Millisecond}, func(w *fakeWorld) {
		w.missNext(name) // the informer shows the object only once it changes
		w.client.PrependReactor("create", "volumeattachments", func(action clienttesting.Action) (bool, runtime.Object, error) {
			handled, obj, err := w.serverCreate(action)
			if calls.Add(1) == 1 && err == nil {
				return true, nil, apierrors.NewTimeoutError("request did not complete within the allowed duration", 0)
			}
			return handled, obj, err
		})
	}, managedNode("node-a"), pv, pvc, podUsing("app", "node-a", "vol-1"))

	w.waitWrites(1)
	w.eventually("the retry reads the VolumeAttachment from the API server", func() bool {
		return slices.ContainsFunc(w.client.Actions(), func(a clienttesting.Action) bool {
			g, ok := a.(clienttesting.GetActionImpl)
			return ok && g.GetResource() == vaResource && g.GetName() == name
		})
	})
	w.settle()
	if got, want := w.writes(), []string{"create volumeattachments " + name}; !slices.Equal(got, want) {
		t.Fatalf("controller writes:\n got %q\nwant %q", got, want)
	}
	w.attach(name)
	w.waitWrites(2)
	w.settle()
	if got, want := w.writes(), []string{"create volumeattachments " + name, "patch nodes/status node-a"}; !slices.Equal(got, want) {
		t.Fatalf("controller writes:\n got %q\nwant %q", got, want)
	}
}

// ownCreateLostInAWatchGap creates the world, lets the controller create
// its VolumeAttachment while the informer misses both that create and the
// delete by another client that follows (a watch gap): the informer never
// shows the object at all. The verify pass is off; check is
// Config.UnseenWriteCheck.
func ownCreateLostInAWatchGap(t *testing.T, check time.Duration) (*fakeWorld, string) {
	pv, pvc := boundClaim("vol-1", v1.ReadWriteOnce)
	name := upstreamVAName("vol-1", testDriver, "node-a")
	w := newFakeWorldWith(t, Config{Workers: 2, UnseenWriteCheck: check}, func(w *fakeWorld) {
		w.missNext(name) // the add
		w.missNext(name) // the delete
	}, managedNode("node-a"), pv, pvc, podUsing("app", "node-a", "vol-1"))
	w.waitWrites(1)
	w.vaGone(name, false)
	return w, name
}

func TestUnseenWrites_ownCreateNeverShownByTheInformerAndGone_createdAgainWithoutTheVerifyPass(t *testing.T) {
	w, name := ownCreateLostInAWatchGap(t, 100*time.Millisecond)
	// The check asks the API server about the create the informer has
	// not shown for a while, finds it gone, and the key creates it again.
	got := w.waitWrites(2)
	if want := []string{"create volumeattachments " + name, "create volumeattachments " + name}; !slices.Equal(got, want) {
		t.Fatalf("writes = %q, want %q", got, want)
	}
	if _, ok := w.va(name); !ok {
		t.Fatalf("VolumeAttachment %s not created again", name)
	}
}

func TestUnseenWrites_ownCreateLostInAWatchGap_waitsUntilTheCheck(t *testing.T) {
	// The control: before the check's time nothing ends the wait (the
	// recovery above is the check's).
	w, _ := ownCreateLostInAWatchGap(t, time.Hour)
	w.noNewWrites(1, 500*time.Millisecond, "the unseen create is not checked yet")
}

// twoCreatesThenNodeStatus checks that the controller's writes are exactly
// two creates of name, then marks it attached and checks that the node
// status patch follows and nothing else. It returns the VolumeAttachment
// the server stored.
func (w *fakeWorld) twoCreatesThenNodeStatus(name string) *storagev1.VolumeAttachment {
	w.t.Helper()
	w.waitWrites(2)
	w.settle()
	want := []string{"create volumeattachments " + name, "create volumeattachments " + name}
	if got := w.writes(); !slices.Equal(got, want) {
		w.t.Fatalf("controller writes:\n got %q\nwant %q", got, want)
	}
	stored, ok := w.va(name)
	if !ok {
		w.t.Fatalf("VolumeAttachment %s not stored", name)
	}
	w.attach(name)
	w.waitWrites(3)
	w.settle()
	if got, want := w.writes(), append(want, "patch nodes/status node-a"); !slices.Equal(got, want) {
		w.t.Fatalf("controller writes:\n got %q\nwant %q", got, want)
	}
	return stored
}

// The chaos run's double publish: the controller created a
// VolumeAttachment for an exclusive volume on node-a, its Pod went away at
// once and the controller deleted the VA before the informer had shown it.
// csi-attacher had already put its finalizer on it (a publish in flight),
// so the object still existed, being deleted. The controller took "not in
// the cache" for gone and attached the volume to node-b.
//
// unseenDeleteWorld plays that up to the point where node-b wants the
// volume and checks that the controller waits. The verify pass is off;
// check is Config.UnseenWriteCheck.
func unseenDeleteWorld(t *testing.T, check time.Duration) (w *fakeWorld, nameA, nameB string) {
	pv, pvc := boundClaim("vol-1", v1.ReadWriteOnce)
	nameA = upstreamVAName("vol-1", testDriver, "node-a")
	nameB = upstreamVAName("vol-1", testDriver, "node-b")
	w = newFakeWorldWith(t, Config{Workers: 2, UnseenWriteCheck: check}, func(w *fakeWorld) {
		w.missNext(nameA) // the add
		// The delete finds csi-attacher's finalizer: the object stays,
		// being deleted, and the informer misses that update too.
		w.finalizerHoldsDeleteOf(nameA)
	}, managedNode("node-a"), managedNode("node-b"), pv, pvc, podUsing("app-a", "node-a", "vol-1"))

	w.waitWrites(1) // create on node-a
	w.deletePod("app-a")
	w.waitWrites(2) // delete on node-a: never attached, never in use
	w.addPod(podUsing("app-b", "node-b", "vol-1"))
	w.noNewWrites(2, 500*time.Millisecond, "the node-a VolumeAttachment still exists, being deleted")
	if got, want := w.writes(), []string{"create volumeattachments " + nameA, "delete volumeattachments " + nameA}; !slices.Equal(got, want) {
		t.Fatalf("writes = %q, want %q", got, want)
	}
	return w, nameA, nameB
}

func TestDelete_ownVolumeAttachmentDeletedBeforeTheInformerShowedIt_blocksTheOtherNodeUntilGone(t *testing.T) {
	w, nameA, nameB := unseenDeleteWorld(t, time.Hour)
	// csi-attacher unpublishes and lets it go; the informer reports that.
	w.vaGone(nameA, false)
	got := w.waitWrites(3)
	if got[2] != "create volumeattachments "+nameB {
		t.Fatalf("writes = %q, want node-b's create once node-a's VolumeAttachment is gone", got)
	}
}

func TestUnseenWrites_ownDeleteNeverShownByTheInformerAndGone_otherNodeAttachesWithoutTheVerifyPass(t *testing.T) {
	// The informer misses the final delete as well (a watch gap): the
	// check asks the API server while the object is still there (the
	// wait goes on), then once it is gone, and lets node-b attach.
	w, nameA, nameB := unseenDeleteWorld(t, 200*time.Millisecond)
	w.vaGone(nameA, true)
	got := w.waitWrites(3)
	if got[2] != "create volumeattachments "+nameB {
		t.Fatalf("writes = %q, want node-b's create once the check found node-a's VolumeAttachment gone", got)
	}
}

func TestUnseenWrites_ownDeleteLostInAWatchGap_waitsUntilTheCheck(t *testing.T) {
	// The control: before the check's time nothing tells the controller
	// that the VolumeAttachment is gone.
	w, nameA, _ := unseenDeleteWorld(t, time.Hour)
	w.vaGone(nameA, true)
	w.noNewWrites(2, 500*time.Millisecond, "the unseen delete is not checked yet")
}

// TestUnseenWrites_chaosStall_ownVolumeAttachmentCreatedAndDeletedInAWatchGap_wantedAgainOnItsNode
// is the chaos run's stall ("volume handle … is wanted on [node] but has
// no VolumeAttachment there"), step by step. The controller creates the
// VolumeAttachment of a Pod on node-a, the Pod goes away at once, and the
// controller deletes the object, all while its informer's watch is down
// (an API server restart): csi-attacher's finalizer holds the object
// until its unpublish is done, then the object is gone before the
// informer lists again, so the informer never shows it, neither its
// creation nor its deletion. The overlay of the controller's own writes
// shows it as being deleted until the informer reports it gone, which
// never happens. A new Pod on node-a waits "for the VolumeAttachment
// being deleted" with nothing to wake it; only the verify pass (which
// the chaos run does not run, and which runs once a minute by default)
// ended that wait.
func TestUnseenWrites_chaosStall_ownVolumeAttachmentCreatedAndDeletedInAWatchGap_wantedAgainOnItsNode(t *testing.T) {
	pv, pvc := boundClaim("vol-1", v1.ReadWriteOnce)
	name := upstreamVAName("vol-1", testDriver, "node-a")
	w := newFakeWorldWith(t, Config{Workers: 2, UnseenWriteCheck: 200 * time.Millisecond}, func(w *fakeWorld) {
		w.missNext(name) // the add
		w.finalizerHoldsDeleteOf(name)
	}, managedNode("node-a"), pv, pvc, podUsing("app-1", "node-a", "vol-1"))
	w.waitWrites(1) // create
	w.deletePod("app-1")
	w.waitWrites(2) // delete: the finalizer holds it
	w.vaGone(name, true)
	w.addPod(podUsing("app-2", "node-a", "vol-1"))
	got := w.waitWrites(3)
	if want := []string{"create volumeattachments " + name, "delete volumeattachments " + name, "create volumeattachments " + name}; !slices.Equal(got, want) {
		t.Fatalf("writes = %q, want %q", got, want)
	}
	if _, ok := w.va(name); !ok {
		t.Fatalf("VolumeAttachment %s not created again", name)
	}
	// csi-attacher attaches it; the volume reaches the node's status.
	w.attach(name)
	if got := w.waitWrites(4)[3]; got != "patch nodes/status node-a" {
		t.Fatalf("write after the attach = %q, want the node status", got)
	}
	if got := w.nodePatches("node-a"); !slices.EqualFunc(got, [][]v1.UniqueVolumeName{{uniqueName("vol-1")}}, slices.Equal) {
		t.Errorf("node status patches = %v, want one listing vol-1", got)
	}
}
