package controller

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/latchcsi/latch/internal/attachdetach/state"
	"github.com/latchcsi/latch/internal/runner"
)

// settledWorld is a cluster as a restarted controller finds it: on each
// node, perNode volumes attached (VolumeAttachment attached, listed in the
// node's volumesAttached and volumesInUse) and used by a running Pod.
func settledWorld(nodes, perNode int) (objs []runtime.Object, keys []state.Key) {
	for n := range nodes {
		node := managedNode(fmt.Sprintf("node-%d", n))
		for i := range perNode {
			h := fmt.Sprintf("disk-%d-%d", n, i)
			pv, pvc := boundClaim(h, v1.ReadWriteOnce)
			va := &storagev1.VolumeAttachment{
				ObjectMeta: metav1.ObjectMeta{Name: upstreamVAName(h, testDriver, node.Name)},
				Spec: storagev1.VolumeAttachmentSpec{
					Attacher: testDriver, NodeName: node.Name,
					Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv.Name},
				},
				Status: storagev1.VolumeAttachmentStatus{Attached: true},
			}
			node.Status.VolumesAttached = append(node.Status.VolumesAttached, v1.AttachedVolume{Name: uniqueName(h)})
			node.Status.VolumesInUse = append(node.Status.VolumesInUse, uniqueName(h))
			objs = append(objs, pv, pvc, va, podUsing("app-"+h, node.Name, h))
			keys = append(keys, state.Key{Volume: uniqueName(h), Node: node.Name})
		}
		objs = append(objs, node)
	}
	return objs, keys
}

// A controller that starts with many settled volumes and one Pod that
// still needs its volume attached serves that Pod's key first: the start
// wakes every key it knows, but the settled ones wait in the key queue's
// low lane. Each settled key is still reconciled, and nothing of them is
// written. Run several times: the informers' initial events race
// the rebuild.
func TestStart_podThatNeedsWorkServedBeforeEverySettledVolume(t *testing.T) {
	for run := range 5 {
		t.Run(fmt.Sprint(run), func(t *testing.T) {
			objs, settled := settledWorld(3, 20)
			pv, pvc := boundClaim("new-disk", v1.ReadWriteOnce)
			objs = append(objs, pv, pvc, podUsing("new-app", "node-0", "new-disk"))
			newKey := state.Key{Volume: uniqueName("new-disk"), Node: "node-0"}

			var mu sync.Mutex
			var order []state.Key
			w := newFakeWorldWith(t, Config{Workers: 1}, func(w *fakeWorld) {
				c := w.c
				// One worker, each pass recorded: the order passes run in
				// is the order the queue serves keys.
				c.wake.keys = runner.New[state.Key](runner.ReconcilerFunc[state.Key](func(ctx context.Context, k state.Key) (runner.Result, error) {
					mu.Lock()
					order = append(order, k)
					mu.Unlock()
					return c.syncKey(ctx, k)
				}), runner.Options{Name: "attachdetach_volumes_start_order", Workers: 1})
			}, objs...)

			w.eventually("every settled key reconciled once", func() bool {
				mu.Lock()
				defer mu.Unlock()
				for _, k := range settled {
					if !slices.Contains(order, k) {
						return false
					}
				}
				return true
			})
			w.eventually("the new Pod's VolumeAttachment created", func() bool {
				_, ok := w.va(upstreamVAName("new-disk", testDriver, "node-0"))
				return ok
			})
			mu.Lock()
			got := slices.Clone(order)
			mu.Unlock()
			first := slices.Index(got, newKey)
			if first < 0 {
				t.Fatalf("the new Pod's key %v never reconciled; passes: %v", newKey, got)
			}
			for _, k := range got[:first] {
				if slices.Contains(settled, k) {
					t.Fatalf("settled key %v reconciled before the new Pod's key (pass %d of %d)", k, slices.Index(got, k), first)
				}
			}
			newVA := "create volumeattachments " + upstreamVAName("new-disk", testDriver, "node-0")
			for _, wr := range w.writes() {
				if wr != newVA && wr != "patch nodes/status node-0" {
					t.Errorf("unexpected write at start: %s (all: %v)", wr, w.writes())
				}
			}
		})
	}
}
