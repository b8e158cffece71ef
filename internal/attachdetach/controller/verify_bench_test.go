package controller

import (
	"context"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// BenchmarkVerify times one verify pass, the controller's only work at
// rest (once per VerifyPeriod), over a settled cluster of 10 volumes per
// node: every VolumeAttachment attached and known to the actual state, so
// the pass finds no drift and wakes nothing. docs/scale.md relates it to
// the idle CPU of the full-size scale run.
//
//	go test -run '^$' -bench BenchmarkVerify -benchmem ./internal/attachdetach/controller/
func BenchmarkVerify(b *testing.B) {
	for _, volumes := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("volumes=%d", volumes), func(b *testing.B) {
			objs, _ := settledWorld(volumes/10, 10)
			w := newFakeWorld(b, DefaultConfig(), objs...)
			// The start's passes over every key run first; the pass is
			// timed at rest.
			err := wait.PollUntilContextTimeout(w.ctx, 50*time.Millisecond, 5*time.Minute, true, func(context.Context) (bool, error) {
				return w.c.wake.backlog() == 0, nil
			})
			if err != nil {
				b.Fatalf("the start's passes did not finish: %d keys queued", w.c.wake.backlog())
			}
			writes := len(w.writes())
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				w.c.verify(w.ctx)
			}
			b.StopTimer()
			if got := w.c.wake.backlog(); got != 0 {
				b.Errorf("a verify pass over a settled cluster woke %d keys, want none", got)
			}
			if got := len(w.writes()); got != writes {
				b.Errorf("a verify pass over a settled cluster wrote %d times, want none", got-writes)
			}
		})
	}
}
