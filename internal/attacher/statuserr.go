package attacher

import (
	"context"
	"fmt"
	"strings"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/runner"
)

// maxVolumeErrorMessageBytes is the API server's limit on a VolumeError's
// message (k8s.io/kubernetes/pkg/apis/storage/validation,
// maxVolumeErrorMessageSize); a longer one makes the whole status write
// fail. recordError gives the event the same, already cut, message: events
// created through events.k8s.io/v1 have that limit too (core validation's
// NoteLengthLimit); the core/v1 events client-go's recorder writes are not
// checked against it, but a 5,000-byte event helps nobody either.
const maxVolumeErrorMessageBytes = 1024

// fitMessage returns msg cut to at most limit bytes (at a UTF-8 boundary),
// marked as truncated with its original length. The start is kept: our
// context (operation, volume, node), the gRPC code and the start of the
// driver's text. Should that context alone fill the room, the gRPC code is
// put in front so it is never lost.
func fitMessage(msg string, code *int32, limit int) string {
	if len(msg) <= limit {
		return msg
	}
	marker := fmt.Sprintf("… (truncated, %d bytes in all)", len(msg))
	head := ""
	if code != nil {
		if c := "code = " + codes.Code(*code).String(); !strings.Contains(cutUTF8(msg, limit-len(marker)), c) {
			head = c + ": "
		}
	}
	return head + cutUTF8(msg, limit-len(marker)-len(head)) + marker
}

// cutUTF8 returns the longest prefix of s of at most n bytes that does not
// split a UTF-8 sequence.
func cutUTF8(s string, n int) string {
	if n <= 0 {
		return ""
	}
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// writeFailed records a refused API write in status.attachError (attach:
// a PV finalizer or VA metadata write, with an AttachFailed event) or
// status.detachError (detach: the finalizer removal after a successful
// unpublish, with a DetachFailed event), and returns the error for the
// runner's backoff: a write that keeps failing, for missing RBAC say, is
// shown on the VolumeAttachment instead of only in our log. A conflict, a
// failed precondition (422 from a JSON patch test) or a vanished object is
// not recorded: it means our cache was behind, and the next pass reads a
// newer one. After a detach's unpublish the next pass unpublishes again
// (idempotent) and retries the removal.
func (e *executor) writeFailed(ctx context.Context, va *storagev1.VolumeAttachment, attach bool, err error) (runner.Result, error) {
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) || apierrors.IsInvalid(err) {
		return runner.Result{}, err
	}
	if rerr := e.recordError(ctx, va, attach, err.Error(), nil); rerr != nil {
		klog.FromContext(ctx).Error(rerr, "Record a refused write in the VolumeAttachment's status", "attach", attach)
	}
	return runner.Result{}, err
}
