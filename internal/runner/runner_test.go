package runner

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/latchcsi/latch/internal/testsupport/logrec"
)

func TestRunner_errorIsRetriedWithExponentialBackoff(t *testing.T) {
	h := startHarness(t, Options{RetryIntervalStart: time.Second, RetryIntervalMax: 8 * time.Second}, alwaysFail)
	h.runner.Enqueue("a")
	h.expectCall("a", t0)
	h.waitPass("a")

	at := t0
	for _, d := range []time.Duration{1, 2, 4, 8, 8} { // doubles, then capped at max
		at = at.Add(d * time.Second)
		h.expectRetryAt("a", at)
	}
	if got := h.runner.queue.NumRequeues("a"); got != 6 {
		t.Fatalf("NumRequeues = %d, want 6 failures counted", got)
	}
}

func TestRunner_successForgetsBackoff(t *testing.T) {
	h := startHarness(t, Options{}, func(_ context.Context, _ string, n int) (Result, error) {
		if n == 3 {
			return Result{}, nil
		}
		return Result{}, errBoom
	})
	h.runner.Enqueue("a")
	h.expectCall("a", t0)
	h.waitPass("a")
	h.expectRetryAt("a", t0.Add(1*time.Second))
	h.expectRetryAt("a", t0.Add(3*time.Second)) // succeeds
	if got := h.runner.queue.NumRequeues("a"); got != 0 {
		t.Fatalf("after success NumRequeues = %d, want 0", got)
	}
	// The next failure starts again from the initial interval, not 4s.
	h.runner.Enqueue("a")
	h.expectCall("a", t0.Add(3*time.Second))
	h.waitPass("a")
	h.expectRetryAt("a", t0.Add(4*time.Second))
}

func TestRunner_requeueAfterIsHonouredAndResetsBackoff(t *testing.T) {
	h := startHarness(t, Options{}, func(_ context.Context, _ string, n int) (Result, error) {
		if n == 1 {
			return Result{}, errBoom
		}
		return Result{RequeueAfter: 30 * time.Second}, nil
	})
	h.runner.Enqueue("a")
	h.expectCall("a", t0)
	h.waitPass("a")
	h.expectRetryAt("a", t0.Add(time.Second))
	if got := h.runner.queue.NumRequeues("a"); got != 0 {
		t.Fatalf("after RequeueAfter NumRequeues = %d, want 0", got)
	}
	h.expectRetryAt("a", t0.Add(31*time.Second))
}

func TestRunner_errorWinsOverRequeueAfter(t *testing.T) {
	h := startHarness(t, Options{}, func(context.Context, string, int) (Result, error) {
		return Result{RequeueAfter: time.Hour}, errBoom
	})
	h.runner.Enqueue("a")
	h.expectCall("a", t0)
	h.waitPass("a")
	h.expectRetryAt("a", t0.Add(time.Second))
}

func TestRunner_terminalErrorIsNotRetried(t *testing.T) {
	h := startHarness(t, Options{}, func(context.Context, string, int) (Result, error) {
		return Result{}, Terminal(errors.New("invalid spec"))
	})
	h.runner.Enqueue("a")
	h.expectCall("a", t0)
	h.waitPass("a")
	if got := h.runner.queue.NumRequeues("a"); got != 0 {
		t.Fatalf("after terminal error NumRequeues = %d, want 0", got)
	}
	h.clock.Step(10 * time.Minute)
	h.expectNoCall()
	// An event for the object brings it back.
	h.runner.Enqueue("a")
	h.expectCall("a", t0.Add(10*time.Minute))
	h.waitPass("a")
}

func TestRunner_forgetAndEnqueueResetsBackoff(t *testing.T) {
	h := startHarness(t, Options{}, alwaysFail)
	h.runner.Enqueue("a")
	h.expectCall("a", t0)
	h.waitPass("a")
	h.expectRetryAt("a", t0.Add(1*time.Second))
	h.expectRetryAt("a", t0.Add(3*time.Second)) // next retry would be at +7s

	// The blocking condition clears (e.g. CSINode gains the driver).
	h.runner.ForgetAndEnqueue("a")
	h.expectCall("a", t0.Add(3*time.Second)) // at once, no clock step
	h.waitPass("a")
	// It failed again, but counts as the first failure: 1s, not 8s.
	h.expectRetryAt("a", t0.Add(4*time.Second))
}

func TestRunner_enqueueDoesNotResetBackoff(t *testing.T) {
	h := startHarness(t, Options{}, alwaysFail)
	h.runner.Enqueue("a")
	h.expectCall("a", t0)
	h.waitPass("a")
	h.expectRetryAt("a", t0.Add(1*time.Second)) // 2 failures, retry due at +3s
	h.runner.Enqueue("a")                       // e.g. our own status write came back as an event
	h.expectCall("a", t0.Add(1*time.Second))
	h.waitPass("a")
	if got := h.runner.queue.NumRequeues("a"); got != 3 {
		t.Fatalf("NumRequeues = %d, want 3: an event must not reset the backoff", got)
	}
	// The retry scheduled earlier still fires (the delaying queue keeps the
	// earliest due time), and fails for the 4th time: next delay is 8s.
	h.expectRetryAt("a", t0.Add(3*time.Second))
	h.expectRetryAt("a", t0.Add(11*time.Second))
}

func TestRunner_panicIsRecoveredAndRetriedWithBackoff(t *testing.T) {
	h := startHarness(t, Options{}, func(_ context.Context, _ string, n int) (Result, error) {
		if n == 1 {
			panic("nil map write")
		}
		return Result{}, nil
	})
	h.runner.Enqueue("a")
	h.expectCall("a", t0)
	h.waitPass("a")
	h.expectRetryAt("a", t0.Add(time.Second))
	// The runner still serves other keys.
	h.runner.Enqueue("b")
	h.expectCall("b", t0.Add(time.Second))
	h.waitPass("b")
}

func TestRunner_shutdownWaitsForInFlightReconcile(t *testing.T) {
	started := make(chan struct{})
	release := make(chan struct{})
	ctxErrAtEnd := make(chan error, 1)
	h := startHarness(t, Options{Workers: 1}, func(ctx context.Context, key string, _ int) (Result, error) {
		if key == "a" {
			close(started)
			<-release
			ctxErrAtEnd <- ctx.Err()
		}
		return Result{}, nil
	})
	h.runner.Enqueue("a")
	<-started
	h.expectCall("a", t0)
	h.runner.Enqueue("b") // waits behind "a" on the single worker

	h.cancel()
	select {
	case err := <-h.runErr:
		t.Fatalf("Run returned %v while a reconcile was in flight", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	select {
	case err := <-h.runErr:
		if err != nil {
			t.Fatalf("Run returned %v, want nil", err)
		}
		h.runErr <- err // for the cleanup
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after the in-flight reconcile finished")
	}
	if err := <-ctxErrAtEnd; err != nil {
		t.Fatalf("in-flight reconcile saw its context cancelled (%v) before the drain timeout", err)
	}
	h.expectNoCall() // "b" is dropped, not started during shutdown
}

func TestRunner_drainTimeoutCancelsStuckReconcile(t *testing.T) {
	started := make(chan struct{})
	ctxErr := make(chan error, 1)
	h := startHarness(t, Options{DrainTimeout: 10 * time.Second}, func(ctx context.Context, _ string, _ int) (Result, error) {
		close(started)
		<-ctx.Done()
		ctxErr <- ctx.Err()
		return Result{}, ctx.Err()
	})
	h.runner.Enqueue("a")
	<-started
	h.cancel()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case err := <-h.runErr:
			if !errors.Is(err, ErrDrainTimeout) {
				t.Fatalf("Run returned %v, want ErrDrainTimeout", err)
			}
			if err := <-ctxErr; !errors.Is(err, context.Canceled) {
				t.Fatalf("stuck reconcile saw %v, want context.Canceled", err)
			}
			h.waitPass("a") // the worker settles before the test ends
			h.runErr <- err
			return
		case <-deadline:
			t.Fatal("Run did not give up after the drain timeout")
		case <-time.After(5 * time.Millisecond):
			h.clock.Step(time.Second)
		}
	}
}

func TestRunner_sameKeyIsNeverProcessedConcurrently(t *testing.T) {
	var mu sync.Mutex
	inFlight := map[string]int{}
	aStarted := make(chan struct{})
	releaseA := make(chan struct{})
	h := startHarness(t, Options{Workers: 4}, func(_ context.Context, key string, n int) (Result, error) {
		mu.Lock()
		inFlight[key]++
		if inFlight[key] > 1 {
			t.Errorf("key %q reconciled concurrently", key)
		}
		mu.Unlock()
		if key == "a" && n == 1 {
			close(aStarted)
			<-releaseA
		}
		mu.Lock()
		inFlight[key]--
		mu.Unlock()
		return Result{}, nil
	})
	h.runner.Enqueue("a")
	<-aStarted
	h.expectCall("a", t0)
	for range 10 {
		h.runner.Enqueue("a")
	}
	// Other keys are served by the other workers meanwhile.
	h.runner.Enqueue("b")
	h.expectCall("b", t0)
	h.waitPass("b")
	h.expectNoCall() // no second "a" while the first is in flight

	close(releaseA)
	h.waitPass("a")
	// The ten adds during processing coalesce into exactly one more pass.
	h.expectCall("a", t0)
	h.waitPass("a")
	h.expectNoCall()
}

func TestRunner_passLoggerCarriesControllerKeyAndPass(t *testing.T) {
	logger, rec := logrec.New(10)

	done := make(chan struct{})
	r := New[string](ReconcilerFunc[string](func(ctx context.Context, key string) (Result, error) {
		klog.FromContext(ctx).Info("Inside reconcile")
		return Result{}, nil
	}), Options{Name: "logtest", Clock: testingclock.NewFakeClock(t0)})
	r.afterPass = func(string) { close(done) }
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	runErr := make(chan error, 1)
	go func() { runErr <- r.Run(ctx) }()
	r.Enqueue("vol-1")
	<-done
	cancel()
	if err := <-runErr; err != nil {
		t.Fatal(err)
	}

	lines := rec.Lines()
	for _, l := range lines {
		if strings.Contains(l, `"msg"="Inside reconcile"`) {
			for _, want := range []string{`"controller"="logtest"`, `"key"="vol-1"`, `"pass"=1`} {
				if !strings.Contains(l, want) {
					t.Errorf("reconcile log line %s lacks %s", l, want)
				}
			}
			return
		}
	}
	t.Fatalf("reconcile log line not found in %q", lines)
}

func TestRunner_runTwiceIsAnError(t *testing.T) {
	r := New[string](ReconcilerFunc[string](func(context.Context, string) (Result, error) { return Result{}, nil }),
		Options{Name: "twice", Clock: testingclock.NewFakeClock(t0)})
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := r.Run(ctx); err != nil {
		t.Fatalf("first Run: %v", err)
	}
	if err := r.Run(ctx); err == nil {
		t.Fatal("second Run: want error")
	}
}

func TestRunner_abortContextCancelsInFlightReconcileAtOnce(t *testing.T) {
	// Losing the leader lease cancels run's context and its abort context
	// together: the reconcile in flight must see its context cancelled at
	// once, not after the drain timeout (the fake clock never moves here).
	started := make(chan struct{})
	ctxErr := make(chan error, 1)
	rec := ReconcilerFunc[string](func(ctx context.Context, _ string) (Result, error) {
		close(started)
		<-ctx.Done()
		ctxErr <- ctx.Err()
		return Result{}, ctx.Err()
	})
	r := New[string](rec, Options{Name: "abort_test", Workers: 1, Clock: testingclock.NewFakeClock(t0), DrainTimeout: time.Hour})
	_, ctx := ktesting.NewTestContext(t)
	abortCtx, abort := context.WithCancel(ctx)
	runCtx, cancelRun := context.WithCancel(abortCtx)
	defer cancelRun()
	runErr := make(chan error, 1)
	go func() { runErr <- r.Run(WithAbort(runCtx, abortCtx)) }()
	r.Enqueue("a")
	<-started

	abort() // cancels runCtx too, as the lease's context does
	select {
	case err := <-ctxErr:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("in-flight reconcile saw %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("in-flight reconcile was not cancelled after the abort")
	}
	select {
	case err := <-runErr:
		if err != nil {
			t.Fatalf("Run returned %v, want nil (the aborted reconcile returned)", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after the abort")
	}
}
