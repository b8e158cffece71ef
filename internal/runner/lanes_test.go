package runner

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
)

// newIdleRunner is a Runner whose queue the test drains by hand (no
// workers), to see the order keys come out in.
func newIdleRunner(t *testing.T) *Runner[string] {
	t.Helper()
	r := New[string](ReconcilerFunc[string](func(context.Context, string) (Result, error) { return Result{}, nil }), Options{Name: "lanes-" + t.Name()})
	t.Cleanup(r.queue.ShutDown)
	return r
}

// take pops n keys, marking each done.
func take(r *Runner[string], n int) []string {
	var out []string
	for range n {
		k, _ := r.queue.Get()
		r.queue.Done(k)
		out = append(out, k)
	}
	return out
}

// A controller's start enqueues every key it knows with EnqueueLater;
// a key woken by a change meanwhile is served first, and a plain Enqueue
// of a key waiting in the low lane moves it up. Nothing is served twice
// or lost.
func TestEnqueueLater_keysWokenByChangesGoFirst(t *testing.T) {
	r := newIdleRunner(t)
	r.EnqueueLater("settled-1")
	r.EnqueueLater("settled-2")
	r.EnqueueLater("settled-3")
	r.Enqueue("new-pod")
	r.Enqueue("settled-2")      // changed meanwhile: moves up, behind new-pod
	r.EnqueueLater("new-pod")   // already in the normal lane: stays there
	r.EnqueueLater("settled-1") // already in the low lane: keeps its place
	if got := r.Len(); got != 4 {
		t.Fatalf("Len = %d, want 4 (one per key)", got)
	}
	got := take(r, 4)
	if want := []string{"new-pod", "settled-2", "settled-1", "settled-3"}; !slices.Equal(got, want) {
		t.Fatalf("served %v, want %v", got, want)
	}
	if r.Len() != 0 || r.OldestItemAge() != 0 {
		t.Fatalf("drained queue: Len %d, OldestItemAge %v", r.Len(), r.OldestItemAge())
	}
}

// A key enqueued while it is being processed is queued again when its
// pass ends, in the lane of that enqueue.
func TestEnqueueLater_keyInProcessGoesToTheLaneOfItsNextEnqueue(t *testing.T) {
	r := newIdleRunner(t)
	r.Enqueue("a")
	r.Enqueue("b")
	a, _ := r.queue.Get()
	b, _ := r.queue.Get()
	r.EnqueueLater(a)
	r.Enqueue("c")
	r.Enqueue(b)
	r.queue.Done(a)
	r.queue.Done(b)
	if got, want := take(r, 3), []string{"c", "b", "a"}; !slices.Equal(got, want) {
		t.Fatalf("served %v, want %v", got, want)
	}
}

// Random interleavings of Enqueue, EnqueueLater and serving: every key
// enqueued is served exactly once per time it was queued (the queue
// coalesces a key that waits), no key of the low lane is served while a
// key of the normal lane waits, and Len counts each waiting key once.
func TestEnqueueLater_randomOperationsServeEveryKeyOnceInLaneOrder(t *testing.T) {
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 7))
		r := newIdleRunner(t)
		lane := map[string]int{} // waiting key → 0 normal, 1 low
		for range 300 {
			k := string(rune('a' + rng.IntN(12)))
			switch op := rng.IntN(3); op {
			case 0:
				r.Enqueue(k)
				lane[k] = 0
			case 1:
				r.EnqueueLater(k)
				if _, waiting := lane[k]; !waiting {
					lane[k] = 1
				}
			case 2:
				if len(lane) == 0 {
					continue
				}
				got := take(r, 1)[0]
				l, waiting := lane[got]
				if !waiting {
					t.Fatalf("seed %d: served %q, which was not waiting (waiting: %v)", seed, got, lane)
				}
				if l == 1 {
					for other, ol := range lane {
						if ol == 0 {
							t.Fatalf("seed %d: served %q from the low lane while %q waited in the normal lane", seed, got, other)
						}
					}
				}
				delete(lane, got)
			}
			if r.Len() != len(lane) {
				t.Fatalf("seed %d: Len %d, want %d (%v)", seed, r.Len(), len(lane), lane)
			}
		}
		for len(lane) > 0 {
			got := take(r, 1)[0]
			if _, waiting := lane[got]; !waiting {
				t.Fatalf("seed %d: served %q, which was not waiting", seed, got)
			}
			delete(lane, got)
		}
	}
}
