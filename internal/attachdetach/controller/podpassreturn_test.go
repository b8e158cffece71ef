package controller

import (
	"sync"
	"sync/atomic"
	"testing"

	v1 "k8s.io/api/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"

	"github.com/latchcsi/latch/internal/attachdetach/state"
	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// gatedClaims is the PVC lister with a hook the test sets: a Pod pass
// that resolves a claim runs it first, so the test can act at that point
// of the pass (between its look at the node and its desired state write).
type gatedClaims struct {
	corelisters.PersistentVolumeClaimLister
	hook *atomic.Pointer[func()]
}

func (g gatedClaims) PersistentVolumeClaims(ns string) corelisters.PersistentVolumeClaimNamespaceLister {
	if h := g.hook.Load(); h != nil {
		(*h)()
	}
	return g.PersistentVolumeClaimLister.PersistentVolumeClaims(ns)
}

// A Pod pass that found its node unmanaged, while the node came back
// (managed again, its Pods noted as still to record again) before the pass
// ended, did not record the Pod's volumes: it must not count the Pod as
// recorded again, or the node's detaches go ahead while the running Pod's
// volume looks unwanted and a re-registered Node's empty volumesInUse
// makes it look unmounted. The pass that the node's return wakes records
// the Pod and lets the node go. Both places where a pass finds the node
// unmanaged: before resolving the Pod's volumes, and when writing them to
// the desired state. Each scenario runs several times.
func TestPodPass_nodeUnmanagedWhenItLooked_doesNotCountThePodRecordedAgain(t *testing.T) {
	podKey := state.PodKey(testNS, "app")
	key := state.Key{Volume: uniqueName("vol-1"), Node: "node-a"}
	for _, tc := range []struct {
		name string
		// managed says whether node-a has the annotation at the start.
		managed bool
		// pass runs the Pod pass such that it finds node-a unmanaged
		// while node-a comes back before the pass ends (cameBack plays
		// the node handler's bookkeeping of the return).
		pass func(w *fakeWorld, hook *atomic.Pointer[func()], cameBack func()) error
	}{
		{"unmanaged before the pass resolves the Pod's volumes", false,
			func(w *fakeWorld, _ *atomic.Pointer[func()], cameBack func()) error {
				// What the pass reads of the node is the desired state's
				// NodeManaged, before anything else; its end sees what the
				// return left: the same as a return that came between.
				cameBack()
				_, err := w.c.syncPod(w.ctx, podKey)
				return err
			}},
		{"unmanaged when the pass writes the Pod's volumes", true,
			func(w *fakeWorld, hook *atomic.Pointer[func()], cameBack func()) error {
				var once sync.Once
				h := func() {
					once.Do(func() {
						// The annotation goes while the pass resolves, and
						// the return is noted before the pass ends.
						w.c.dsw.AddNode("node-a", false)
						cameBack()
					})
				}
				hook.Store(&h)
				defer hook.Store(nil)
				_, err := w.c.syncPod(w.ctx, podKey)
				return err
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for range 3 {
				pv, pvc := boundClaim("vol-1", v1.ReadWriteOnce)
				node := managedNode("node-a")
				if !tc.managed {
					delete(node.Annotations, kubenames.ControllerManagedAttachAnnotation)
				}
				hook := &atomic.Pointer[func()]{}
				w := newFakeWorldWith(t, Config{Workers: 2}, func(w *fakeWorld) {
					w.c.pvcLister = gatedClaims{PersistentVolumeClaimLister: w.c.pvcLister, hook: hook}
				}, node, pv, pvc, podUsing("app", "node-a", "vol-1"))
				w.settle()
				if _, wanted := w.c.dsw.Get(key); wanted != tc.managed {
					t.Fatalf("at start, the volume wanted on node-a = %v, want %v", wanted, tc.managed)
				}

				cameBack := func() { w.c.returning.start("node-a", []string{podKey}) }
				if err := tc.pass(w, hook, cameBack); err != nil {
					t.Fatalf("Pod pass: %v", err)
				}
				if _, wanted := w.c.dsw.Get(key); wanted {
					t.Fatal("the pass recorded the Pod on a node it found unmanaged")
				}
				if n := w.c.returning.pending("node-a"); n != 1 {
					t.Fatalf("node-a has %d Pods still to record again after a pass that did not record app, want 1 (app)", n)
				}

				// The rest of the node's return: managed again, its Pods woken.
				w.c.dsw.AddNode("node-a", true)
				w.c.wake.Pod(testNS, "app")
				w.eventually("app recorded again and node-a let go", func() bool {
					_, wanted := w.c.dsw.Get(key)
					return wanted && w.c.returning.pending("node-a") == 0
				})
			}
		})
	}
}
