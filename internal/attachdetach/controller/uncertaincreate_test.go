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
	"k8s.io/apimachinery/pkg/runtime/schema"
	clienttesting "k8s.io/client-go/testing"
)

// A VolumeAttachment create whose outcome the controller does not know,
// while its informer never shows the object: the Pod goes away and
// another Pod wants the ReadWriteOnce volume on node-b. The object may
// exist (and csi-attacher may publish it), so the controller must not
// forget it: it asks the API server, deletes what it finds, and attaches
// node-b only once node-a's VolumeAttachment is gone.

// uncertainCreateWorld runs the scenario up to node-b's Pod. answer is
// the error the first create of node-a's VolumeAttachment returns after
// the server stored it (stored) or not; getErrs makes that many reads of
// it fail first; retry is the first backoff of a failed pass.
func uncertainCreateWorld(t *testing.T, stored bool, answer error, getErrs int32, retry time.Duration) (w *fakeWorld, nameA, nameB string, gets *atomic.Int32) {
	t.Helper()
	pv, pvc := boundClaim("vol-1", v1.ReadWriteOnce)
	nameA = upstreamVAName("vol-1", testDriver, "node-a")
	nameB = upstreamVAName("vol-1", testDriver, "node-b")
	gets = &atomic.Int32{}
	var creates atomic.Int32
	w = newFakeWorldWith(t, Config{Workers: 2, RetryIntervalStart: retry, RetryIntervalMax: 5 * retry}, func(w *fakeWorld) {
		w.missNext(nameA) // the informer never shows the create
		w.client.PrependReactor("create", "volumeattachments", func(action clienttesting.Action) (bool, runtime.Object, error) {
			if action.(clienttesting.CreateActionImpl).GetObject().(*storagev1.VolumeAttachment).Name != nameA || creates.Add(1) > 1 {
				return false, nil, nil
			}
			if stored {
				if _, _, err := w.serverCreate(action); err != nil {
					t.Errorf("store %s: %v", nameA, err)
				}
			}
			return true, nil, answer
		})
		// The delete finds csi-attacher's finalizer: the object stays,
		// being deleted, and the informer misses that update too.
		w.finalizerHoldsDeleteOf(nameA)
		w.client.PrependReactor("get", "volumeattachments", func(action clienttesting.Action) (bool, runtime.Object, error) {
			if action.(clienttesting.GetActionImpl).GetName() == nameA && gets.Add(1) <= getErrs {
				return true, nil, apierrors.NewServiceUnavailable("injected: API server unavailable")
			}
			return false, nil, nil
		})
	}, managedNode("node-a"), managedNode("node-b"), pv, pvc, podUsing("app-a", "node-a", "vol-1"))
	w.waitWrites(1)
	return w, nameA, nameB, gets
}

// podMovesToNodeB deletes node-a's Pod and makes one on node-b want the
// volume.
func (w *fakeWorld) podMovesToNodeB() {
	w.deletePod("app-a")
	w.addPod(podUsing("app-b", "node-b", "vol-1"))
}

func TestCreate_outcomeUnknownAndStored_podGone_theAPIServerIsAsked_deletedBeforeTheOtherNodeAttaches(t *testing.T) {
	vaGroupResource := schema.GroupResource{Group: "storage.k8s.io", Resource: "volumeattachments"}
	for _, tc := range []struct {
		name   string
		answer error
	}{
		{"500", apierrors.NewInternalError(errors.New("injected: answer lost after the write"))},
		{"timeout", apierrors.NewTimeoutError("request did not complete within the allowed duration", 0)},
		{"AlreadyExists", apierrors.NewAlreadyExists(vaGroupResource, "x")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, nameA, nameB, gets := uncertainCreateWorld(t, true, tc.answer, 0, 10*time.Millisecond)
			w.podMovesToNodeB()
			w.waitWrites(2)
			w.noNewWrites(2, 300*time.Millisecond, "node-a's VolumeAttachment exists, being deleted")
			if got, want := w.writes(), []string{"create volumeattachments " + nameA, "delete volumeattachments " + nameA}; !slices.Equal(got, want) {
				t.Fatalf("writes = %q, want %q", got, want)
			}
			if gets.Load() == 0 {
				t.Error("the controller never asked the API server about the VolumeAttachment")
			}
			// csi-attacher unpublishes and lets it go.
			w.vaGone(nameA, false)
			if got := w.waitWrites(3); got[2] != "create volumeattachments "+nameB {
				t.Fatalf("writes = %q, want node-b's create once node-a's VolumeAttachment is gone", got)
			}
		})
	}
}

func TestCreate_outcomeUnknownNotStored_theAPIServerSaysNotFound_createdAgain(t *testing.T) {
	w, nameA, _, gets := uncertainCreateWorld(t, false, apierrors.NewInternalError(errors.New("injected: rejected before the write")), 0, 10*time.Millisecond)
	got := w.waitWrites(2)
	w.settle()
	if want := []string{"create volumeattachments " + nameA, "create volumeattachments " + nameA}; !slices.Equal(w.writes(), want) {
		t.Fatalf("writes = %q, want %q", got, want)
	}
	if gets.Load() != 1 {
		t.Errorf("%d reads of %s, want 1: the second create only after the API server said it had none", gets.Load(), nameA)
	}
}

func TestCreate_outcomeUnknown_readsFail_keepsBlockingUntilTheAPIServerAnswers(t *testing.T) {
	w, nameA, nameB, gets := uncertainCreateWorld(t, true, apierrors.NewInternalError(errors.New("injected")), 5, 10*time.Millisecond)
	w.podMovesToNodeB()
	w.eventually("the reads of node-a's VolumeAttachment failed and were retried", func() bool { return gets.Load() > 5 })
	got := w.waitWrites(2)
	if got[1] != "delete volumeattachments "+nameA {
		t.Fatalf("writes = %q, want node-a's VolumeAttachment deleted once the API server answered", got)
	}
	w.vaGone(nameA, false)
	if got := w.waitWrites(3); got[2] != "create volumeattachments "+nameB {
		t.Fatalf("writes = %q, want node-b's create last", got)
	}
}
