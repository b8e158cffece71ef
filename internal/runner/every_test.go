package runner

import (
	"context"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// Every calls f once per period of its clock, never before the first
// period has passed, and returns once ctx is done.
func TestEveryCallsOncePerPeriodUntilCancelled(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(0, 0))
	ctx, cancel := context.WithCancel(context.Background())
	calls := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		Every(ctx, clk, time.Minute, func(context.Context) { calls <- struct{}{} })
	}()
	for !clk.HasWaiters() {
		time.Sleep(time.Millisecond)
	}
	clk.Step(59 * time.Second)
	select {
	case <-calls:
		t.Fatal("f called before one period passed")
	case <-time.After(50 * time.Millisecond):
	}
	for i := range 3 {
		clk.Step(time.Minute)
		select {
		case <-calls:
		case <-time.After(10 * time.Second):
			t.Fatalf("f not called after period %d", i+1)
		}
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Every did not return after ctx was cancelled")
	}
}
