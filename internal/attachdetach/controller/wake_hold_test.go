package controller

import (
	"context"
	"testing"

	"github.com/latchcsi/latch/internal/attachdetach/state"
	"github.com/latchcsi/latch/internal/runner"
)

// newHoldingWake is a wake as New builds it, before the rebuild: every
// wake held, no worker running.
func newHoldingWake(names *state.Names) *wake {
	nop := func(context.Context, string) (runner.Result, error) { return runner.Result{}, nil }
	nopKey := func(context.Context, state.Key) (runner.Result, error) { return runner.Result{}, nil }
	return &wake{
		keys:       runner.New[state.Key](runner.ReconcilerFunc[state.Key](nopKey), runner.Options{Name: "keys"}),
		pods:       runner.New[string](runner.ReconcilerFunc[string](nop), runner.Options{Name: "pods"}),
		nodeStatus: runner.New[string](runner.ReconcilerFunc[string](nop), runner.Options{Name: "node_status"}),
		vas:        runner.New[string](runner.ReconcilerFunc[string](nop), runner.Options{Name: "vas"}),
		dsw:        state.NewDesired(),
		asw:        state.NewActual(),
		names:      names,
		held:       map[state.Key]struct{}{},
		heldPods:   map[string]struct{}{},
		heldVAs:    map[string]struct{}{},
	}
}

// The Pod and VolumeAttachment wakes of the informers' initial events wait
// for the rebuild; what the rebuild did not cover reaches the same queue
// (or key) it would have reached at once, and nothing is lost.
func TestWake_holdsInitialPodAndVolumeAttachmentWakesUntilTheRebuild(t *testing.T) {
	known := state.Key{Volume: "kubernetes.io/csi/disk.csi.example.com^vol-1", Node: "node-a"}
	for _, tc := range []struct {
		name string
		// before runs while the wakes are held (initial events and the
		// rebuild); after runs once they are released.
		before, after func(w *wake, names *state.Names)
		wantPods      []string
		wantVAs       int
		wantHeldKey   bool
	}{
		{
			name: "a Pod the rebuild recorded after its initial event runs no Pod pass",
			before: func(w *wake, _ *state.Names) {
				w.Pod(testNS, "app")
				w.PodRecorded(state.PodKey(testNS, "app"))
			},
		},
		{
			name: "a Pod changed after the rebuild recorded it gets its pass",
			before: func(w *wake, _ *state.Names) {
				w.Pod(testNS, "app")
				w.PodRecorded(state.PodKey(testNS, "app"))
				w.Pod(testNS, "app")
			},
			wantPods: []string{state.PodKey(testNS, "app")},
		},
		{
			name:     "a Pod the rebuild did not record (unscheduled, or created after its list) gets its pass",
			before:   func(w *wake, _ *state.Names) { w.Pod(testNS, "pending") },
			wantPods: []string{state.PodKey(testNS, "pending")},
		},
		{
			name:     "a Pod woken after the release is queued at once",
			after:    func(w *wake, _ *state.Names) { w.Pod(testNS, "late") },
			wantPods: []string{state.PodKey(testNS, "late")},
		},
		{
			name: "a VolumeAttachment the rebuild registered wakes its key, still held",
			before: func(w *wake, names *state.Names) {
				w.VolumeAttachment("csi-known")
				names.Set("csi-known", known)
			},
			wantHeldKey: true,
		},
		{
			name:    "a VolumeAttachment the rebuild could not key goes to the VolumeAttachment queue",
			before:  func(w *wake, _ *state.Names) { w.VolumeAttachment("csi-unknown") },
			wantVAs: 1,
		},
		{
			name:    "a VolumeAttachment woken after the release with an unknown name is queued at once",
			after:   func(w *wake, _ *state.Names) { w.VolumeAttachment("csi-new") },
			wantVAs: 1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			names := state.NewNames()
			w := newHoldingWake(names)
			if tc.before != nil {
				tc.before(w, names)
			}
			if w.pods.Len() != 0 || w.vas.Len() != 0 {
				t.Fatalf("queued before the release: %d Pods, %d VolumeAttachments", w.pods.Len(), w.vas.Len())
			}
			w.releaseHeld()
			if tc.after != nil {
				tc.after(w, names)
			}
			if w.pods.Len() != len(tc.wantPods) {
				t.Errorf("Pod queue holds %d, want %v", w.pods.Len(), tc.wantPods)
			}
			if w.vas.Len() != tc.wantVAs {
				t.Errorf("VolumeAttachment queue holds %d, want %d", w.vas.Len(), tc.wantVAs)
			}
			if _, held := w.held[known]; held != tc.wantHeldKey {
				t.Errorf("key %s held = %v, want %v", known, held, tc.wantHeldKey)
			}
			if w.keys.Len() != 0 {
				t.Errorf("key queue holds %d before releaseKeys", w.keys.Len())
			}
		})
	}
}
