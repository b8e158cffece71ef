package attacher

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/latchcsi/latch/internal/attacher/decide"
	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// A publish the backend throttles (ResourceExhausted, as a cloud's
// "request limit exceeded") is recorded in attachError with its code and
// one event, as any failure, but the pass returns no error: it asks to run
// again after the backend's latency, so the VolumeAttachment's own backoff
// (for volumes that fail) does not grow, and the call limit backs off.
// Upstream's external-attacher retries it with the growing backoff.
func TestThrottledPublishIsRetriedWithoutGrowingTheBackoff(t *testing.T) {
	f := newExecFixture(t, execPV("pv-a"), execVA("va-a", "pv-a"), execCSINode())
	if _, err := f.driver.AddFault(csimock.Rule{Method: "ControllerPublishVolume", Code: codes.ResourceExhausted, Message: csimock.ThrottledMessage}); err != nil {
		t.Fatal(err)
	}
	res, err := f.ctrl.syncAttach(f.ctx, "va-a")
	if err != nil || res.RequeueAfter < time.Second {
		t.Fatalf("syncAttach = %+v, %v; want no error and a requeue after at least a second", res, err)
	}
	f.requireCSICalls("ControllerPublishVolume handle-pv-a node-1-id ResourceExhausted")
	va := f.va("va-a")
	if va.Status.Attached || va.Status.AttachError == nil || !strings.Contains(va.Status.AttachError.Message, "Request limit exceeded") ||
		va.Status.AttachError.ErrorCode == nil || *va.Status.AttachError.ErrorCode != int32(codes.ResourceExhausted) {
		t.Errorf("VA status = %+v, want attachError with the driver's message and code", va.Status)
	}
	if ev := drainEvents(f.recorder); len(ev) != 1 || !strings.HasPrefix(ev[0], "Warning "+EventAttachFailed) {
		t.Errorf("events = %q, want one Warning %s", ev, EventAttachFailed)
	}
	if got := f.ctrl.exec.calls.Throttled(); got != 1 {
		t.Errorf("throttled answers counted by the call limit = %d, want 1", got)
	}
}

// The same for an unpublish: detachError recorded, the finalizer kept, no
// error for the backoff.
func TestThrottledUnpublishIsRetriedWithoutGrowingTheBackoff(t *testing.T) {
	f := newExecFixture(t, execPV("pv-d"), deleting(attachedVA("va-d", "pv-d")), execCSINode())
	if _, err := f.driver.AddFault(csimock.Rule{Method: "ControllerUnpublishVolume", Code: codes.Unavailable, Message: csimock.ThrottledMessage}); err != nil {
		t.Fatal(err)
	}
	res, err := f.ctrl.syncDetach(f.ctx, "va-d")
	if err != nil || res.RequeueAfter < time.Second {
		t.Fatalf("syncDetach = %+v, %v; want no error and a requeue after at least a second", res, err)
	}
	f.requireCSICalls("ControllerUnpublishVolume handle-pv-d node-1-id Unavailable")
	got := f.va("va-d")
	if de := got.Status.DetachError; de == nil || !strings.Contains(de.Message, "Request limit exceeded") {
		t.Errorf("detachError = %+v, want the driver's message", de)
	}
	if !got.Status.Attached || !slices.Contains(got.Finalizers, kubenames.AttacherFinalizer(execDriver)) {
		t.Errorf("VA after a throttled detach: attached %v, finalizers %v; want both kept", got.Status.Attached, got.Finalizers)
	}
	if got := f.ctrl.exec.calls.Throttled(); got != 1 {
		t.Errorf("throttled answers counted by the call limit = %d, want 1", got)
	}
}

// Which answers are the backend pushing back, which are latency samples,
// and which say nothing of its load.
func TestCallOutcome(t *testing.T) {
	for _, c := range []struct {
		code   codes.Code
		gaveUp bool
		want   string
	}{
		{codes.OK, false, "served"},
		{codes.ResourceExhausted, false, "throttled"},
		{codes.Unavailable, false, "throttled"},
		{codes.DeadlineExceeded, false, "served"},
		{codes.DeadlineExceeded, true, "ignored"},
		{codes.Internal, false, "ignored"},
		{codes.NotFound, false, "ignored"},
		{codes.Aborted, false, "ignored"},
	} {
		var err error
		if c.code != codes.OK {
			err = status.Error(c.code, "driver says so")
		}
		got := []string{"served", "throttled", "ignored"}[callOutcome(err, c.gaveUp)]
		if got != c.want {
			t.Errorf("callOutcome(%s, gave up %v) = %s, want %s", c.code, c.gaveUp, got, c.want)
		}
	}
}

// Package decide numbers gRPC codes itself (it may not import gRPC): its
// numbers must be gRPC's, and codeOf must hand them over unchanged, an
// error without a gRPC status as Unknown.
func TestDecideCodesAreGRPCCodes(t *testing.T) {
	for _, c := range []struct {
		decide decide.Code
		grpc   codes.Code
	}{
		{decide.CodeOK, codes.OK},
		{decide.CodeUnknown, codes.Unknown},
		{decide.CodeDeadlineExceeded, codes.DeadlineExceeded},
		{decide.CodeResourceExhausted, codes.ResourceExhausted},
		{decide.CodeUnavailable, codes.Unavailable},
	} {
		if uint32(c.decide) != uint32(c.grpc) {
			t.Errorf("decide's code for %s is %d, gRPC's is %d", c.grpc, c.decide, c.grpc)
		}
		if c.grpc == codes.OK {
			continue
		}
		if got := codeOf(status.Error(c.grpc, "driver says so")); got != c.decide {
			t.Errorf("codeOf(%s error) = %d, want %d", c.grpc, got, c.decide)
		}
	}
	if got := codeOf(errors.New("not a gRPC error")); got != decide.CodeUnknown {
		t.Errorf("codeOf(an error without a gRPC status) = %d, want Unknown (%d)", got, decide.CodeUnknown)
	}
}
