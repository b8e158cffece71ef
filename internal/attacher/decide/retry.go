package decide

import (
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// How a pass that met a failure is retried, decided from the facts of the
// failure: the gRPC code of the driver's answer (a failed unpublish), the
// API status of a refused write, or what blocked a call the plan forbade.
// The executor records the failure and returns the pass's result as the
// answer says; it makes none of these choices itself.

// Code is a gRPC status code as the driver answered, with the numbers of
// google.golang.org/grpc/codes, which this package may not import (the
// executor converts; package attacher's tests check that the numbers
// agree). A driver error that carries no gRPC status is CodeUnknown.
type Code uint32

// The codes the decisions below tell apart.
const (
	CodeOK                Code = 0
	CodeUnknown           Code = 2
	CodeDeadlineExceeded  Code = 4
	CodeResourceExhausted Code = 8
	CodeUnavailable       Code = 14
)

// Throttled reports whether a driver's answer with code is the backend
// pushing back: ResourceExhausted (a cloud's request limit, as drivers
// pass it on) or Unavailable (a driver that cannot take the call now).
// Such an answer backs the call limit off, and the VolumeAttachment is
// retried after the backend's latency instead of with its own backoff.
func Throttled(code Code) bool {
	return code == CodeResourceExhausted || code == CodeUnavailable
}

// Retry is how the pass that met a failure runs again.
type Retry int

const (
	// RetryBackoff: the pass returns the failure and the runner retries
	// the VolumeAttachment with its exponential backoff.
	RetryBackoff Retry = iota
	// RetryTerminal: the pass returns the failure as terminal: only an
	// edit of the VolumeAttachment can change the outcome, and it is not
	// retried until the VolumeAttachment changes.
	RetryTerminal
	// RetryPoll: the pass waits for an object latch does not watch (a
	// Secret): the failure is recorded and the pass runs again after
	// Config.SecretRetryInterval, without an error and so without
	// backoff.
	RetryPoll
	// RetryThrottled: the backend pushed back: the failure is recorded
	// and the pass runs again after the backend's latency (one period of
	// the call limit's control), without an error, so that the
	// VolumeAttachment's backoff, which is for volumes that fail, does
	// not grow.
	RetryThrottled
)

var retryNames = [...]string{"Backoff", "Terminal", "Poll", "Throttled"}

func (r Retry) String() string {
	if int(r) >= 0 && int(r) < len(retryNames) {
		return retryNames[r]
	}
	return "Retry(?)"
}

// AfterUnpublishFailed decides how a detach whose ControllerUnpublish
// failed with code is retried. Whatever the code, the volume may still be
// attached: the finalizer stays and the failure goes into
// status.detachError. A throttled answer (Throttled) is retried after the
// backend's latency, any other with backoff.
func AfterUnpublishFailed(code Code) Retry {
	if Throttled(code) {
		return RetryThrottled
	}
	return RetryBackoff
}

// WhenNotCalled decides how a pass is retried whose plan forbade a driver
// call (b: why, from BeforeCall). Waiting for an object latch does not
// watch (ClassWaitForObject: a missing or forbidden Secret) is polled;
// anything else is an attach failure, retried with backoff, or terminal
// when only an edit of the VolumeAttachment can change it. (A detach's
// calls are forbidden only for a Secret.)
func WhenNotCalled(b *Blocked) Retry {
	switch b.Reason.Class() {
	case ClassWaitForObject:
		return RetryPoll
	case ClassTerminal:
		return RetryTerminal
	}
	return RetryBackoff
}

// RecordRefusedWrite decides whether a refused API write of an attach (the
// PV finalizer, the VolumeAttachment's finalizer and annotations) or of a
// detach (the finalizer's removal after a successful unpublish) is
// recorded in the VolumeAttachment's status; status is the API status of
// the write's error (the zero Status when the error carries none, such as
// a connection that failed). Either way the pass returns the error, for
// backoff.
//
// Recorded: a write that keeps failing, for missing RBAC say, is shown on
// the VolumeAttachment instead of only in the log. Not recorded: a
// conflict, a failed precondition (422 Invalid, from a JSON patch's test)
// or an object gone (404) mean that the cache was behind, and the next
// pass reads a newer one. A status whose reason is not one the API server
// knows is judged by its HTTP code, as apimachinery's IsConflict,
// IsInvalid and IsNotFound do.
func RecordRefusedWrite(status metav1.Status) bool {
	err := &apierrors.StatusError{ErrStatus: status}
	return !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) && !apierrors.IsInvalid(err)
}
