package testsupport

import (
	"context"
	"errors"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// TB is the part of testing.TB Eventually needs (so rigs that are not
// tests can pass their own).
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
}

// PollInterval is how often Eventually and Poll check their condition.
const PollInterval = 20 * time.Millisecond

// Poll checks cond every PollInterval until it holds, returns an error,
// ctx ends or timeout passes.
func Poll(ctx context.Context, timeout time.Duration, cond func(ctx context.Context) (bool, error)) error {
	return wait.PollUntilContextTimeout(ctx, PollInterval, timeout, true, cond)
}

// Eventually is Poll that fails the test, naming what it waited for.
// onFail, when given, runs before the failure (to log the state that
// explains it).
func Eventually(t TB, ctx context.Context, timeout time.Duration, what string, cond func(ctx context.Context) (bool, error), onFail ...func()) {
	t.Helper()
	if err := Poll(ctx, timeout, cond); err != nil {
		for _, f := range onFail {
			f()
		}
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// ConsistentlyInterval is how often Consistently checks its condition.
const ConsistentlyInterval = 100 * time.Millisecond

// Consistently checks cond every ConsistentlyInterval for d and fails
// the test the first time it does not hold (or returns an error, or ctx
// ends), naming what should have held and after how long. onFail, when
// given, runs before the failure (to log the state that explains it).
func Consistently(t TB, ctx context.Context, d time.Duration, what string, cond func(ctx context.Context) (bool, error), onFail ...func()) {
	t.Helper()
	start := time.Now()
	for {
		ok, err := cond(ctx)
		if err == nil && !ok {
			err = errors.New("condition false")
		}
		if err == nil && time.Since(start) >= d {
			return
		}
		if err == nil {
			select {
			case <-ctx.Done():
				err = ctx.Err()
			case <-time.After(ConsistentlyInterval):
				continue
			}
		}
		for _, f := range onFail {
			f()
		}
		t.Fatalf("%s stopped holding after %s: %v", what, time.Since(start).Round(time.Millisecond), err)
		return
	}
}
