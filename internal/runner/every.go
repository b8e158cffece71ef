package runner

import (
	"context"
	"time"

	"k8s.io/utils/clock"
)

// Every calls f each time a ticker of clk with period fires, first one
// period after the start, until ctx is done. A call that outlasts the
// period delays the next (the ticker drops ticks meanwhile). It is how the
// controllers run their periodic safety nets (the attacher's ListVolumes
// reconcile, the attach/detach controller's verify pass).
func Every(ctx context.Context, clk clock.WithTicker, period time.Duration, f func(context.Context)) {
	t := clk.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			f(ctx)
		}
	}
}
