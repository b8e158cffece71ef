package attacher

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/latchcsi/latch/internal/adaptive"
	"github.com/latchcsi/latch/internal/attacher/decide"
	"github.com/latchcsi/latch/internal/csi"
	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/runner"
)

// Event reasons on VolumeAttachments.
const (
	EventAttachFailed = "AttachFailed"
	EventDetachFailed = "DetachFailed"
)

// executor carries out the plans of package decide: every API write and
// every CSI call an attach or detach makes goes through it, one method a
// step (addPVFinalizer, setMetadata, publish, unpublish, writeStatus,
// recordError; executor_steps.go), and runAttach / runDetach carry out a
// whole plan in order and return what happened (attachOutcome). It holds
// no informer and no queue and calls nothing back: the Controller
// observes, decides, hands it the plan and settles the outcome.
type executor struct {
	driver DriverInfo
	// timeout bounds one ControllerPublish/Unpublish call (not the wait
	// for its slot); secretRetryInterval is when a pass blocked on a
	// Secret, which is not watched, is retried.
	timeout, secretRetryInterval time.Duration

	client kubernetes.Interface
	csi    CSIClient
	// vaCache and pvCache are the overlays of our own writes: every write
	// is recorded there, so the Controller's next read sees it before the
	// watch does.
	vaCache *kube.OverlaidStore[*storagev1.VolumeAttachment]
	pvCache *kube.OverlaidStore[*v1.PersistentVolume]
	// calls bounds the CSI publish and unpublish calls in flight
	// (callLimiter, executor_steps.go).
	calls    *adaptive.Limiter
	recorder record.EventRecorder
	metrics  *Metrics
	clock    clock.Clock
	// records keeps the orphans where a restart finds them (the
	// ConfigMap, orphanstore.go); nil when Config.OrphanNamespace is empty.
	records orphanStore
}

// vaFate is what became of the VolumeAttachment a publication was made
// for, as far as the answer to a status write and a live read tell.
type vaFate int

const (
	// vaKept: the object is there (same UID) and a detach of ours will
	// come for it, or it is not deleting.
	vaKept vaFate = iota
	// vaGone: gone, replaced by another object of the same name, or
	// deleting without our finalizer (decide.PublishedForGone): the
	// publication is an orphan.
	vaGone
	// vaUnknown: the write failed for a reason that tells neither, and
	// nothing read the object since: the next pass of its name decides
	// (a suspect, attachOutcome).
	vaUnknown
)

// vaFateAfter says what the failed status write of va (err) tells of it:
// NotFound means gone; the answer to the UID precondition the status patch
// carries (the API server rejects a patch whose metadata.uid differs from
// the stored object's with 422, metadata.uid: field is immutable; a 409 is
// accepted as well), whose codes also have other causes, is decided by a
// live read of the object. Any other failure (a 500, a timeout) tells
// nothing: vaUnknown.
func (e *executor) vaFateAfter(ctx context.Context, va *storagev1.VolumeAttachment, err error) vaFate {
	switch {
	case apierrors.IsNotFound(err):
		return vaGone
	case apierrors.IsInvalid(err) || apierrors.IsConflict(err):
		return e.vaLiveFate(ctx, va)
	}
	return vaUnknown
}

// vaLiveFate reads va's object from the API server (a failed read:
// vaUnknown).
func (e *executor) vaLiveFate(ctx context.Context, va *storagev1.VolumeAttachment) vaFate {
	live, gerr := e.readVA(ctx, va.Name)
	if gerr != nil {
		return vaUnknown
	}
	if decide.PublishedForGone(live, va.UID, e.driver.Name) {
		return vaGone
	}
	return vaKept
}

// vaWrittenFate says what the object our own successful write of va
// returned (recorded in the overlay) tells: deleting without our finalizer
// means another client removed it while the driver published.
func (e *executor) vaWrittenFate(va *storagev1.VolumeAttachment) vaFate {
	cur, ok, err := e.vaCache.Get(va.Name)
	if err != nil || !ok || cur.UID != va.UID {
		return vaKept
	}
	if decide.PublishedForGone(cur, va.UID, e.driver.Name) {
		return vaGone
	}
	return vaKept
}

// attachOutcome is what came of running an attach plan, as a value: the
// pass's result and error, and the publication the driver made (or may
// have made) for a VolumeAttachment whose fate needs the orphan
// bookkeeping. The executor calls nothing back; the pass hands published
// to the orphans (Controller.afterAttach).
type attachOutcome struct {
	res runner.Result
	err error
	// published is set when the VolumeAttachment the driver published for
	// is gone, replaced or deleting without our finalizer (gone), or when
	// the write that would have told failed for another reason (a
	// suspect: the next pass of its name reads it).
	published *publication
}

// publication is a publication made, or possibly made (o.uncertain), for a
// VolumeAttachment, with what showed that its fate matters.
type publication struct {
	o     orphan
	cause error
	// gone: an orphan; otherwise a suspect.
	gone bool
}

// outcome is an attachOutcome without a publication to settle.
func outcome(res runner.Result, err error) attachOutcome { return attachOutcome{res: res, err: err} }

// orphaned is the outcome of a publication for va, which is gone or
// replaced: the pass makes it an orphan and its result is the orphan's.
func orphaned(va *storagev1.VolumeAttachment, plan decide.AttachPlan, secrets map[string]string, cause error, uncertain bool) attachOutcome {
	return attachOutcome{published: &publication{o: publicationOf(va, plan, secrets, uncertain), cause: cause, gone: true}}
}

// suspected is the outcome of a publication for va whose fate is not
// known, with the pass's result res and err.
func suspected(va *storagev1.VolumeAttachment, plan decide.AttachPlan, secrets map[string]string, cause error, uncertain bool, res runner.Result, err error) attachOutcome {
	return attachOutcome{res: res, err: err, published: &publication{o: publicationOf(va, plan, secrets, uncertain), cause: cause}}
}

// runAttach carries out plan for va (pv is the PV the plan was decided
// on): the PV finalizer, the unpublication of a publication recorded under
// an old node ID, the VA's finalizer and annotations, ControllerPublish
// and the status; a failure is recorded in status.attachError with its
// class deciding the retry.
func (e *executor) runAttach(ctx context.Context, va *storagev1.VolumeAttachment, pv *v1.PersistentVolume, plan decide.AttachPlan) attachOutcome {
	switch {
	case plan.Trivial:
		return outcome(runner.Result{}, e.writeStatus(ctx, va, storagev1.VolumeAttachmentStatus{Attached: true, AttachmentMetadata: va.Status.AttachmentMetadata}))
	case plan.Done:
		return outcome(runner.Result{}, nil)
	case plan.Blocked != nil:
		return outcome(e.attachFailed(ctx, va, plan.Blocked, nil))
	}

	if plan.AddPVFinalizer != "" {
		if err := e.addPVFinalizer(ctx, pv); err != nil {
			return outcome(e.writeFailed(ctx, va, true, err))
		}
	}
	if plan.UnpublishFirst != nil {
		// The node ID is about to be rewritten: undo the publication
		// recorded under the old one while the record still names it.
		if res, err := e.unpublishRecorded(ctx, va, plan); err != nil || res.RequeueAfter > 0 {
			return outcome(res, err)
		}
	}
	if plan.Metadata != nil {
		// Finalizer and node ID go on the VA before the driver is called:
		// once a publish may have happened, a delete must wait for us.
		updated, err := e.setMetadata(ctx, va, plan.Metadata)
		if err != nil {
			return outcome(e.writeFailed(ctx, va, true, err))
		}
		va = updated
	}
	if !plan.Publish {
		return outcome(runner.Result{}, nil)
	}

	publishContext, res, err := e.publish(ctx, plan)
	if stop, r, err := e.notMade(ctx, va, true, res, err); stop {
		return outcome(r, err)
	}
	switch {
	case res.callErr != nil && !csi.IsFinalError(res.callErr):
		// The driver may have published: if the VolumeAttachment went
		// away meanwhile, that possible publication is an orphan.
		return e.publishFailed(ctx, va, plan, res.secrets, nil, res.callErr)
	case res.callErr != nil:
		// A final code: nothing was published, whatever became of va.
		return outcome(e.attachFailed(ctx, va, nil, res.callErr))
	}
	if blocked := decide.CheckPublishContext(publishContext); blocked != nil {
		// The API server would refuse the status write: retrying would
		// only publish again and again. The finalizer stays, so a delete
		// still unpublishes.
		return e.publishFailed(ctx, va, plan, res.secrets, blocked, nil)
	}
	sent, err := e.sendStatus(ctx, va, storagev1.VolumeAttachmentStatus{Attached: true, AttachmentMetadata: publishContext})
	if err != nil {
		switch e.vaFateAfter(ctx, va, err) {
		case vaGone:
			// The VolumeAttachment went away (or was replaced by a new
			// object of the same name) while the driver published it:
			// nothing will ever detach that publication, so undo it now
			// (and retry until it is undone).
			return orphaned(va, plan, res.secrets, err, false)
		case vaUnknown:
			// The retry this error leads to may find the object gone from
			// the cache: remember the publication until a read tells.
			return suspected(va, plan, res.secrets, err, false, runner.Result{}, err)
		}
		return outcome(runner.Result{}, err)
	}
	if !sent {
		// The VA already showed this status, one we did not believe (no
		// finalizer or node-id annotation of ours), so nothing was sent
		// and no UID precondition checked: a live read tells whether va
		// went away, or was replaced, while the driver published.
		if settled, out := e.publishedUnwritten(ctx, va, plan, res.secrets); settled {
			return out
		}
	}
	e.metrics.attached(va.CreationTimestamp.Time, e.clock.Now())
	klog.FromContext(ctx).V(2).Info("Volume attached", "volumeHandle", plan.Volume.Handle)
	return outcome(runner.Result{}, nil)
}

// publishedUnwritten settles a successful publish for va whose status
// needed no write: a live read of va decides (vaLiveFate). Gone, replaced
// or deleting without our finalizer: the publication is an orphan; not
// readable: a suspect, and the error's retry decides. settled is false
// when va is still there, and the attach is done.
func (e *executor) publishedUnwritten(ctx context.Context, va *storagev1.VolumeAttachment, plan decide.AttachPlan, secrets map[string]string) (settled bool, out attachOutcome) {
	switch e.vaLiveFate(ctx, va) {
	case vaGone:
		return true, orphaned(va, plan, secrets, fmt.Errorf("VolumeAttachment %q (uid %s) is gone, replaced or deleting without our finalizer", va.Name, va.UID), false)
	case vaUnknown:
		err := fmt.Errorf("VolumeAttachment %q (uid %s) could not be read after its volume was published", va.Name, va.UID)
		return true, suspected(va, plan, secrets, err, false, runner.Result{}, err)
	}
	return false, attachOutcome{}
}

// runDetach carries out plan for va, which is being deleted:
// ControllerUnpublish, then the removal of our finalizer (and
// status.attached=false when other finalizers keep the object); a
// failure is recorded in status.detachError.
func (e *executor) runDetach(ctx context.Context, va *storagev1.VolumeAttachment, plan decide.DetachPlan) (runner.Result, error) {
	switch {
	case plan.Done:
		return runner.Result{}, nil
	case plan.Blocked != nil:
		return e.detachBlocked(ctx, va, plan.Blocked)
	}
	res, err := e.unpublish(ctx, unpublication{handle: plan.Volume.Handle, nodeID: plan.NodeID,
		secretRef: plan.Volume.Secret, migrated: plan.Volume.Migrated})
	if stop, r, err := e.notMade(ctx, va, false, res, err); stop {
		return r, err
	}
	if res.callErr != nil {
		// Whatever the code, the volume may still be attached: keep the
		// finalizer and retry.
		return e.detachFailed(ctx, va, "", res.callErr)
	}
	if err := e.releaseVA(ctx, va); err != nil {
		return e.writeFailed(ctx, va, false, err)
	}
	klog.FromContext(ctx).V(2).Info("Volume detached", "volumeHandle", plan.Volume.Handle)
	return runner.Result{}, nil
}

// unpublishRecorded undoes the publication plan.UnpublishFirst names (the
// VA recorded another node ID than the CSINode now reports). A failure is
// recorded in status.attachError and retried: the node ID is not rewritten
// until the old publication is gone.
func (e *executor) unpublishRecorded(ctx context.Context, va *storagev1.VolumeAttachment, plan decide.AttachPlan) (runner.Result, error) {
	u := plan.UnpublishFirst
	res, err := e.unpublish(ctx, unpublication{handle: u.Handle, nodeID: u.NodeID,
		secretRef: plan.Volume.Secret, migrated: plan.Volume.Migrated})
	if stop, r, err := e.notMade(ctx, va, true, res, err); stop {
		return r, err
	}
	if res.callErr != nil {
		msg, code := failure(nil, res.callErr)
		return e.attachFailedMsg(ctx, va, fmt.Sprintf("the CSINode of node %q now reports node ID %q; the volume recorded as published to node ID %q must be unpublished first: %s",
			va.Spec.NodeName, plan.NodeID, u.NodeID, msg), code)
	}
	klog.FromContext(ctx).Info("Unpublished the volume from the node ID recorded before the node's CSI node ID changed",
		"volumeHandle", u.Handle, "recordedNodeID", u.NodeID, "nodeID", plan.NodeID)
	return runner.Result{}, nil
}

// notMade reports whether a CSI call the executor was asked to make was
// not made, and what the pass returns then: err (the secret read or the
// wait for a slot failed) goes to the runner's backoff; a call
// decide.BeforeCall blocked is recorded (notCalled).
func (e *executor) notMade(ctx context.Context, va *storagev1.VolumeAttachment, attach bool, res callResult, err error) (bool, runner.Result, error) {
	switch {
	case err != nil:
		return true, runner.Result{}, err
	case res.blocked != nil:
		r, err := e.notCalled(ctx, va, attach, res.blocked)
		return true, r, err
	}
	return false, runner.Result{}, nil
}

// notCalled records why the driver was not called (blocked, decided by
// decide.BeforeCall): an object latch does not watch (a Secret) is polled
// every secretRetryInterval; anything else is an attach failure (a
// detach's blocked reasons are only secrets).
func (e *executor) notCalled(ctx context.Context, va *storagev1.VolumeAttachment, attach bool, blocked *decide.Blocked) (runner.Result, error) {
	if blocked.Reason.Class() != decide.ClassWaitForObject {
		return e.attachFailed(ctx, va, blocked, nil)
	}
	if err := e.recordError(ctx, va, attach, blocked.Message, nil); err != nil {
		return runner.Result{}, err
	}
	return runner.Result{RequeueAfter: e.secretRetryInterval}, nil
}

// attachFailed records a failed attach and returns the error for the
// runner's backoff (terminal when only an edit of the VA can fix it).
func (e *executor) attachFailed(ctx context.Context, va *storagev1.VolumeAttachment, blocked *decide.Blocked, callErr error) (runner.Result, error) {
	msg, code := failure(blocked, callErr)
	if err := e.recordError(ctx, va, true, msg, code); err != nil {
		return runner.Result{}, err
	}
	return attachFailure(ctx, va, blocked, msg)
}

// attachFailedMsg records msg (with the gRPC code, if any) in
// status.attachError and returns it for backoff.
func (e *executor) attachFailedMsg(ctx context.Context, va *storagev1.VolumeAttachment, msg string, code *int32) (runner.Result, error) {
	if err := e.recordError(ctx, va, true, msg, code); err != nil {
		return runner.Result{}, err
	}
	return runner.Result{}, fmt.Errorf("attach VolumeAttachment %q: %s", va.Name, msg)
}

// attachFailure logs a recorded attach failure and returns its error
// (terminal when only an edit of the VA can fix it).
func attachFailure(ctx context.Context, va *storagev1.VolumeAttachment, blocked *decide.Blocked, msg string) (runner.Result, error) {
	klog.FromContext(ctx).V(2).Info("Attach failed", "reason", reasonOf(blocked), "err", msg)
	err := fmt.Errorf("attach VolumeAttachment %q: %s", va.Name, msg)
	if blocked != nil && blocked.Reason.Class() == decide.ClassTerminal {
		return runner.Result{}, runner.Terminal(err)
	}
	return runner.Result{}, err
}

// publishFailed records a failed attach (as attachFailed) after a
// ControllerPublish that published, or may have: it failed with a code that
// leaves its outcome unknown, or succeeded with a publish context that
// cannot be stored. When the status write, which carries va's UID, shows
// that va is gone or replaced — or no write was needed and a live read
// shows it — that publication is an orphan, as after a successful publish.
func (e *executor) publishFailed(ctx context.Context, va *storagev1.VolumeAttachment, plan decide.AttachPlan, secrets map[string]string, blocked *decide.Blocked, callErr error) attachOutcome {
	msg, code := failure(blocked, callErr)
	unchanged := va.Status.AttachError != nil && va.Status.AttachError.Message == fitMessage(msg, code, maxVolumeErrorMessageBytes)
	werr := e.recordError(ctx, va, true, msg, code)
	var fate vaFate
	switch {
	case werr != nil:
		fate = e.vaFateAfter(ctx, va, werr)
	case unchanged:
		// recordError wrote nothing, so nothing checked the UID.
		fate = e.vaLiveFate(ctx, va)
	default:
		// The write went through: the object it returned shows whether
		// our finalizer was removed from it while the driver published.
		fate = e.vaWrittenFate(va)
	}
	switch fate {
	case vaGone:
		cause := werr
		if cause == nil {
			cause = fmt.Errorf("VolumeAttachment %q (uid %s) is gone, replaced or deleting without our finalizer", va.Name, va.UID)
		}
		klog.FromContext(ctx).V(2).Info("Attach failed after a possible publication for a VolumeAttachment that is gone", "reason", reasonOf(blocked), "err", msg)
		return orphaned(va, plan, secrets, fmt.Errorf("%s; then: %w", msg, cause), callErr != nil)
	case vaUnknown:
		cause := werr
		if cause == nil {
			cause = fmt.Errorf("VolumeAttachment %q (uid %s) could not be read", va.Name, va.UID)
		}
		cause = fmt.Errorf("%s; then: %w", msg, cause)
		if werr == nil {
			// The failure itself is recorded. Not terminal, whatever the
			// reason: the retry settles the suspect first.
			klog.FromContext(ctx).V(2).Info("Attach failed", "reason", reasonOf(blocked), "err", msg)
			return suspected(va, plan, secrets, cause, callErr != nil, runner.Result{}, fmt.Errorf("attach VolumeAttachment %q: %s", va.Name, msg))
		}
		return suspected(va, plan, secrets, cause, callErr != nil, runner.Result{}, werr)
	}
	if werr != nil {
		return outcome(runner.Result{}, werr)
	}
	if isThrottled(callErr) {
		return outcome(e.throttled(ctx, va, "Attach", msg))
	}
	return outcome(attachFailure(ctx, va, blocked, msg))
}

// throttled schedules the next try of a VolumeAttachment whose call the
// backend pushed back on (its failure is recorded): after
// throttledRetryInterval, as a success would be requeued, so that the
// runner's per-item backoff (for volumes that fail) does not grow. The
// call limit has already backed off.
func (e *executor) throttled(ctx context.Context, va *storagev1.VolumeAttachment, op, msg string) (runner.Result, error) {
	after := e.throttledRetryInterval()
	klog.FromContext(ctx).V(2).Info(op+" throttled by the backend; retrying", "volumeAttachment", klog.KObj(va), "after", after, "err", msg)
	return runner.Result{RequeueAfter: after}, nil
}

// detachBlocked records why a detach cannot go on (decided by
// decide.Detach) and returns the error for the runner: terminal when only
// an edit of the VolumeAttachment can change the outcome.
func (e *executor) detachBlocked(ctx context.Context, va *storagev1.VolumeAttachment, blocked *decide.Blocked) (runner.Result, error) {
	if err := e.recordError(ctx, va, false, blocked.Message, nil); err != nil {
		return runner.Result{}, err
	}
	klog.FromContext(ctx).V(2).Info("Detach failed", "reason", blocked.Reason, "err", blocked.Message)
	err := fmt.Errorf("detach VolumeAttachment %q: %s", va.Name, blocked.Message)
	if blocked.Reason.Class() == decide.ClassTerminal {
		return runner.Result{}, runner.Terminal(err)
	}
	return runner.Result{}, err
}

// detachFailed records a failed detach and returns the error for backoff.
func (e *executor) detachFailed(ctx context.Context, va *storagev1.VolumeAttachment, msg string, callErr error) (runner.Result, error) {
	var code *int32
	if callErr != nil {
		msg, code = failure(nil, callErr)
	}
	if err := e.recordError(ctx, va, false, msg, code); err != nil {
		return runner.Result{}, err
	}
	if isThrottled(callErr) {
		return e.throttled(ctx, va, "Detach", msg)
	}
	klog.FromContext(ctx).V(2).Info("Detach failed", "err", msg)
	return runner.Result{}, fmt.Errorf("detach VolumeAttachment %q: %s", va.Name, msg)
}

func failure(blocked *decide.Blocked, callErr error) (string, *int32) {
	if blocked != nil {
		return blocked.Message, nil
	}
	code, ok := grpcCode(callErr)
	if !ok {
		return callErr.Error(), nil
	}
	c := int32(code)
	return callErr.Error(), &c
}

func reasonOf(b *decide.Blocked) decide.Reason {
	if b == nil {
		return "DriverError"
	}
	return b.Reason
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
