package decide

import (
	"errors"
	"net/http"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A detach whose ControllerUnpublish failed: the driver's gRPC code
// decides between the throttled retry and the backoff. The codes are
// numbered as google.golang.org/grpc/codes numbers them.
func TestAfterUnpublishFailedScenarios(t *testing.T) {
	for _, sc := range []struct {
		name string
		code Code
		want Retry
	}{
		{"ResourceExhausted (a cloud's request limit) → throttled", CodeResourceExhausted, RetryThrottled},
		{"Unavailable (the driver cannot take the call now) → throttled", CodeUnavailable, RetryThrottled},
		{"DeadlineExceeded (slower than --timeout, may still be in progress) → backoff", CodeDeadlineExceeded, RetryBackoff},
		{"an error without a gRPC status (Unknown) → backoff", CodeUnknown, RetryBackoff},
		{"Internal → backoff", 13, RetryBackoff},
		{"NotFound → backoff", 5, RetryBackoff},
		{"Aborted (an operation on the volume in progress) → backoff", 10, RetryBackoff},
		{"FailedPrecondition → backoff", 9, RetryBackoff},
		{"Canceled → backoff", 1, RetryBackoff},
	} {
		if got := AfterUnpublishFailed(sc.code); got != sc.want {
			t.Errorf("%s: AfterUnpublishFailed(%d) = %s, want %s", sc.name, sc.code, got, sc.want)
		}
	}
}

// Throttled is the one list of codes that are the backend pushing back:
// a publish's answer (Published.Throttled), an unpublish's retry and the
// call limit's outcome all read it.
func TestThrottledCodes(t *testing.T) {
	for code := Code(0); code <= 16; code++ {
		want := code == CodeResourceExhausted || code == CodeUnavailable
		if got := Throttled(code); got != want {
			t.Errorf("Throttled(%d) = %v, want %v", code, got, want)
		}
	}
}

// A pass whose plan forbade a driver call: what blocked the call (decided
// by BeforeCall from the call facts) decides between polling and failing.
func TestWhenNotCalledScenarios(t *testing.T) {
	secret := &v1.SecretReference{Namespace: "ns", Name: "creds"}
	for _, sc := range []struct {
		name    string
		blocked *Blocked
		want    Retry
	}{
		{"the controller-publish secret is missing → polled (Secrets are not watched)",
			BeforeCall(CallFacts{Secret: secret, SecretState: SecretNotFound}), RetryPoll},
		{"the controller-publish secret may not be read → polled",
			BeforeCall(CallFacts{Secret: secret, SecretState: SecretForbidden, SecretDenial: "forbidden"}), RetryPoll},
		{"no CSI capability for the access modes → an attach failure, backoff",
			BeforeCall(CallFacts{CapabilityErr: errors.New("no capability for ReadWriteMany block")}), RetryBackoff},
		{"a publish context recorded as too large → terminal",
			&Blocked{Reason: ReasonPublishContextTooLarge, Message: "too large"}, RetryTerminal},
		{"a reason only an edit of the VolumeAttachment changes (invalid source) → terminal",
			&Blocked{Reason: ReasonInvalidSource, Message: "no PV name"}, RetryTerminal},
		{"waiting for a watched object (the PV) → backoff, woken when it appears",
			&Blocked{Reason: ReasonWaitingForPV, Message: "PV not found"}, RetryBackoff},
		{"an orphaned publication on another node → backoff",
			&Blocked{Reason: ReasonOrphanOnOtherNode, Message: "published elsewhere"}, RetryBackoff},
	} {
		if sc.blocked == nil {
			t.Fatalf("%s: BeforeCall blocked nothing", sc.name)
		}
		if got := WhenNotCalled(sc.blocked); got != sc.want {
			t.Errorf("%s: WhenNotCalled(%s) = %s, want %s", sc.name, sc.blocked.Reason, got, sc.want)
		}
	}
}

// A refused write of an attach or a detach: its API status decides
// whether it is recorded in the VolumeAttachment's status.
func TestRecordRefusedWriteScenarios(t *testing.T) {
	st := func(reason metav1.StatusReason, code int32) metav1.Status {
		return metav1.Status{Status: metav1.StatusFailure, Reason: reason, Code: code}
	}
	for _, sc := range []struct {
		name   string
		status metav1.Status
		want   bool
	}{
		{"forbidden (missing RBAC) → recorded", st(metav1.StatusReasonForbidden, http.StatusForbidden), true},
		{"an internal error of the API server → recorded", st(metav1.StatusReasonInternalError, http.StatusInternalServerError), true},
		{"too many requests → recorded", st(metav1.StatusReasonTooManyRequests, http.StatusTooManyRequests), true},
		{"a server timeout → recorded", st(metav1.StatusReasonTimeout, http.StatusGatewayTimeout), true},
		{"rejected by an admission webhook (BadRequest) → recorded", st(metav1.StatusReasonBadRequest, http.StatusBadRequest), true},
		{"no API status at all (the connection failed) → recorded", metav1.Status{}, true},
		{"a known reason other than the three, with a 409 (AlreadyExists) → recorded", st(metav1.StatusReasonAlreadyExists, http.StatusConflict), true},

		{"a conflict (our cache was behind) → not recorded", st(metav1.StatusReasonConflict, http.StatusConflict), false},
		{"a failed JSON patch test (422 Invalid) → not recorded", st(metav1.StatusReasonInvalid, http.StatusUnprocessableEntity), false},
		{"the object is gone (404) → not recorded", st(metav1.StatusReasonNotFound, http.StatusNotFound), false},
		{"an unknown reason with a 409 → judged by the code: not recorded", st("SomethingNew", http.StatusConflict), false},
		{"an unknown reason with a 422 → not recorded", st("SomethingNew", http.StatusUnprocessableEntity), false},
		{"an unknown reason with a 404 → not recorded", st("SomethingNew", http.StatusNotFound), false},
		{"an unknown reason with a 500 → recorded", st("SomethingNew", http.StatusInternalServerError), true},
	} {
		if got := RecordRefusedWrite(sc.status); got != sc.want {
			t.Errorf("%s: RecordRefusedWrite(reason %q, code %d) = %v, want %v", sc.name, sc.status.Reason, sc.status.Code, got, sc.want)
		}
	}
}
