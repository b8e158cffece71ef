package runner

import (
	"context"
	"errors"
	"time"
)

// Reconciler brings the world in line with the latest observed state of the
// object named by key.
//
// Reconcile is level-based: it receives a key, not an event, and must read
// the current state from listers (never trust what caused the call), so that
// running it once or five times in a row for the same key has the same
// effect. Calls coalesce: many events for one key while it is queued give
// one call. The Runner never calls Reconcile concurrently for the same key,
// but does for different keys.
//
// The returned values decide what happens next, in this order:
//   - an error wrapped with Terminal: logged, backoff reset, not retried
//     until something enqueues the key again (typically an informer event
//     for the object);
//   - any other error (including a recovered panic): retried with per-item
//     exponential backoff; Result is ignored;
//   - Result.RequeueAfter > 0: backoff reset, key processed again after that
//     delay (polling something no informer reports, e.g. a CSI operation);
//   - otherwise: success, backoff reset, nothing scheduled.
//
// ctx carries a logger (klog.FromContext) with the key and a pass ID. It is
// not cancelled when the Runner is asked to stop, only when the drain
// timeout expires, so that an operation already sent to a driver can record
// its outcome.
type Reconciler[K comparable] interface {
	Reconcile(ctx context.Context, key K) (Result, error)
}

// ReconcilerFunc adapts a function to Reconciler.
type ReconcilerFunc[K comparable] func(ctx context.Context, key K) (Result, error)

// Reconcile calls f.
func (f ReconcilerFunc[K]) Reconcile(ctx context.Context, key K) (Result, error) {
	return f(ctx, key)
}

// Result tells the Runner what to do after a successful pass.
type Result struct {
	// RequeueAfter, when positive, processes the key again after this
	// delay. It does not count as a failure: the backoff is reset.
	RequeueAfter time.Duration
}

// terminalError marks an error that retrying cannot fix.
type terminalError struct{ err error }

func (e *terminalError) Error() string { return e.err.Error() }
func (e *terminalError) Unwrap() error { return e.err }

// Terminal marks err as not worth retrying until the object changes (for
// example an invalid spec: retrying with backoff would only produce the
// same error and load the API server). Terminal(nil) is nil.
func Terminal(err error) error {
	if err == nil {
		return nil
	}
	return &terminalError{err: err}
}

// IsTerminal reports whether err, or any error it wraps, was marked with
// Terminal.
func IsTerminal(err error) bool {
	var t *terminalError
	return errors.As(err, &t)
}
