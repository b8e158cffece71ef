package controller

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestVolumeLocks_serializeOneVolumeNotOthersAndForgetIdleVolumes(t *testing.T) {
	var l volumeLocks
	var inside, maxInside atomic.Int32
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			unlock := l.lock("vol-a")
			if n := inside.Add(1); n > maxInside.Load() {
				maxInside.Store(n)
			}
			time.Sleep(2 * time.Millisecond)
			inside.Add(-1)
			unlock()
		})
	}
	// Another volume is not held up by vol-a's queue.
	done := make(chan struct{})
	go func() { l.lock("vol-b")(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("vol-b waited for vol-a")
	}
	wg.Wait()
	if maxInside.Load() != 1 {
		t.Errorf("%d passes of one volume ran at once, want 1", maxInside.Load())
	}
	if len(l.m) != 0 {
		t.Errorf("idle volumes still tracked: %v", l.m)
	}
}
