// Package fakeclock helps tests that drive a workqueue's retries with
// k8s.io/utils' fake clock: they step the clock only once the queue has
// armed the timer of a retry, or the retry would move with the step.
package fakeclock

import (
	"time"

	testingclock "k8s.io/utils/clock/testing"
)

// TB is the part of testing.TB the helpers use.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
}

// SettledWaiters returns clock's waiter count once it has stopped
// changing for a moment: with nothing scheduled, the timers a queue always
// holds (its own tickers).
func SettledWaiters(clock *testingclock.FakeClock) int {
	n := clock.Waiters()
	for stable := 0; stable < 5; {
		time.Sleep(2 * time.Millisecond)
		if m := clock.Waiters(); m == n {
			stable++
		} else {
			n, stable = m, 0
		}
	}
	return n
}

// WaitArmed waits until clock has more than idle waiters: a delaying
// queue has armed the timer of a retry (its goroutine reads the clock
// when it takes an AddAfter, so a step before that would shift the retry).
func WaitArmed(t TB, clock *testingclock.FakeClock, idle int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for clock.Waiters() <= idle {
		if time.Now().After(deadline) {
			t.Fatalf("no retry timer armed on the clock (%d waiters)", clock.Waiters())
		}
		time.Sleep(time.Millisecond)
	}
}
