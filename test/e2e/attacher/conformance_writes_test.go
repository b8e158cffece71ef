package attacher_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/latchcsi/latch/internal/testsupport"
)

// upstream: TestCSIHandler "failed write with attached=true -> controller
// retries". The status write that marks the VA attached after a
// successful ControllerPublish is refused once: the attach is retried and
// the VA ends attached with no attachError. Upstream calls
// ControllerPublish again on the retry; so does latch (the publish is
// idempotent and its publish context is what the status must carry).
func TestFailedAttachedStatusWriteIsRetriedUntilTheVAIsAttached(t *testing.T) {
	for i := range 3 {
		e := newEnv(t, envOptions{noAttacher: true})
		tr := testsupport.NewAPITransport()
		e.startAttacherThrough(tr, "", envOptions{})
		pv, vaName := e.prefix+"-pv", e.prefix+"-va"
		tr.FailNth(testsupport.Match{Method: "patch", Resource: "volumeattachments/status", Name: vaName}, 1, http.StatusInternalServerError, "injected: status write lost")
		e.createPV(pv)
		e.createVA(e.newVA(vaName, pv, e.node))
		va := e.waitAttached(vaName, 30*time.Second)
		if va.Status.AttachError != nil {
			t.Fatalf("run %d: attachError %q left after the attach", i, va.Status.AttachError.Message)
		}
		if got := len(e.driver.CallsTo(publishMethod)); got != 2 {
			t.Fatalf("run %d: ControllerPublish calls = %d, want 2 (the first, and the retry after the refused status write)", i, got)
		}
		if got := recorded(e, tr, "PATCH volumeattachments/status", 2); got != 2 {
			t.Fatalf("run %d: status writes = %d, want 2 (refused, then attached)", i, got)
		}
		e.stopAtt()
	}
}

// upstream: TestCSIHandler "unknown PV -> error + error saving the error".
// The PV is missing and the first two attachError writes are refused: the
// attach is retried until the error is shown; nothing is published.
func TestRefusedAttachErrorWriteIsRetriedUntilShown(t *testing.T) {
	e := newEnv(t, envOptions{noAttacher: true})
	tr := testsupport.NewAPITransport()
	e.startAttacherThrough(tr, "", envOptions{})
	pv, vaName := e.prefix+"-pv", e.prefix+"-va"
	tr.Fail(testsupport.Match{Method: "patch", Resource: "volumeattachments/status", Name: vaName}, 2, http.StatusForbidden, "injected: cannot patch status")
	e.createVA(e.newVA(vaName, pv, e.node))
	e.waitAttachError(vaName, pv)
	if got := recorded(e, tr, "PATCH volumeattachments/status", 3); got != 3 {
		t.Errorf("status writes = %d, want 3 (two refused, then the error)", got)
	}
	if n := len(e.driver.CallsTo(publishMethod)); n != 0 {
		t.Errorf("ControllerPublish calls = %d without a PV, want 0", n)
	}
}
