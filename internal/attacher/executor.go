package attacher

import (
	"context"
	"errors"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/latchcsi/latch/internal/adaptive"
	"github.com/latchcsi/latch/internal/attacher/decide"
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
// on; secrets are the controller-publish secret's values read for its
// calls): the PV finalizer, the unpublication of a publication recorded
// under an old node ID, the VA's finalizer and annotations,
// ControllerPublish and the status. A call the plan forbids is not made,
// and why is recorded; what the publish came to is decided by package
// decide (settlePublish).
func (e *executor) runAttach(ctx context.Context, va *storagev1.VolumeAttachment, pv *v1.PersistentVolume, plan decide.AttachPlan, secrets map[string]string) attachOutcome {
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
		if res, err := e.unpublishRecorded(ctx, va, plan, secrets); err != nil || res.RequeueAfter > 0 {
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
	if plan.PublishBlocked != nil {
		return outcome(e.notCalled(ctx, va, true, plan.PublishBlocked))
	}
	answer, err := e.publish(ctx, plan, secrets)
	if err != nil {
		return outcome(runner.Result{}, err)
	}
	return e.settlePublish(ctx, va, plan, secrets, answer)
}

// settlePublish writes what the publish's answer p records
// (decide.AfterPublish: status.attached, or status.attachError), reads va
// live when the write's answer leaves open what became of it
// (decide.VAFate), and returns what decide.PublishOutcome makes of it:
// attached; an orphan (va went away, or was replaced, while the driver
// published: nothing will ever detach that publication, so it is undone
// now, and retried until it is); a suspect (not known: the retry the error
// leads to may find the object gone from the cache, so the publication is
// remembered until a read tells); or a failure to retry.
func (e *executor) settlePublish(ctx context.Context, va *storagev1.VolumeAttachment, plan decide.AttachPlan, secrets map[string]string, p decide.Published) attachOutcome {
	rec := decide.AfterPublish(p)
	facts := decide.FateFacts{UID: va.UID, Driver: e.driver.Name}
	var werr error
	var msg string
	if rec.Attached {
		sent, err := e.sendStatus(ctx, va, storagev1.VolumeAttachmentStatus{Attached: true, AttachmentMetadata: p.Context})
		werr, facts.Write = err, statusWriteOf(sent, err)
	} else {
		var code *int32
		msg, code = failure(rec.Blocked, p.Err)
		// recordError writes nothing when the message is there already;
		// then nothing checked the UID.
		unchanged := va.Status.AttachError != nil && va.Status.AttachError.Message == fitMessage(msg, code, maxVolumeErrorMessageBytes)
		werr = e.recordError(ctx, va, true, msg, code)
		facts.Write = statusWriteOf(!unchanged, werr)
		if rec.MayBePublished && facts.Write == decide.WriteSent {
			// The object the write returned shows whether our finalizer
			// was removed from it while the driver published.
			facts.Written = e.written(va)
		}
	}
	fate := decide.FateKept
	if rec.Attached || rec.MayBePublished {
		var read bool
		if fate, read = decide.VAFate(facts); read {
			facts.Live = e.sight(ctx, va.Name)
			fate, _ = decide.VAFate(facts)
		}
	}
	logger := klog.FromContext(ctx)
	out := decide.PublishOutcome(p, fate, werr != nil)
	switch out.Kind {
	case decide.OutcomeAttached:
		e.metrics.attached(va.CreationTimestamp.Time, e.clock.Now())
		logger.V(2).Info("Volume attached", "volumeHandle", plan.Volume.Handle)
		return outcome(runner.Result{}, nil)
	case decide.OutcomeOrphaned:
		cause := werr
		if cause == nil {
			cause = fmt.Errorf("VolumeAttachment %q (uid %s) is gone, replaced or deleting without our finalizer", va.Name, va.UID)
		}
		if !rec.Attached {
			logger.V(2).Info("Attach failed after a possible publication for a VolumeAttachment that is gone", "reason", reasonOf(rec.Blocked), "err", msg)
			cause = fmt.Errorf("%s; then: %w", msg, cause)
		}
		return orphaned(va, plan, secrets, cause, out.Uncertain)
	case decide.OutcomeSuspect:
		if rec.Attached {
			err := werr
			if err == nil {
				err = fmt.Errorf("VolumeAttachment %q (uid %s) could not be read after its volume was published", va.Name, va.UID)
			}
			return suspected(va, plan, secrets, err, out.Uncertain, runner.Result{}, err)
		}
		cause := werr
		if cause == nil {
			cause = fmt.Errorf("VolumeAttachment %q (uid %s) could not be read", va.Name, va.UID)
		}
		cause = fmt.Errorf("%s; then: %w", msg, cause)
		if werr != nil {
			return suspected(va, plan, secrets, cause, out.Uncertain, runner.Result{}, werr)
		}
		// The failure itself is recorded. Not terminal, whatever the
		// reason: the retry settles the suspect first.
		logger.V(2).Info("Attach failed", "reason", reasonOf(rec.Blocked), "err", msg)
		return suspected(va, plan, secrets, cause, out.Uncertain, runner.Result{}, fmt.Errorf("attach VolumeAttachment %q: %s", va.Name, msg))
	case decide.OutcomeWriteFailed:
		return outcome(runner.Result{}, werr)
	case decide.OutcomeThrottled:
		return outcome(e.throttled(ctx, va, "Attach", msg))
	}
	return outcome(attachFailure(ctx, va, reasonOf(rec.Blocked), msg, out.Terminal))
}

// statusWriteOf is how a status write answered (sent: a patch was sent;
// err: its failure), as decide.VAFate takes it.
func statusWriteOf(sent bool, err error) decide.StatusWrite {
	switch {
	case err == nil && !sent:
		return decide.WriteUnneeded
	case err == nil:
		return decide.WriteSent
	case apierrors.IsNotFound(err):
		return decide.WriteNotFound
	case apierrors.IsInvalid(err) || apierrors.IsConflict(err):
		return decide.WriteRefused
	}
	return decide.WriteFailed
}

// runDetach carries out plan for va, which is being deleted:
// ControllerUnpublish, then the removal of our finalizer (and
// status.attached=false when other finalizers keep the object); a
// failure is recorded in status.detachError. secrets are the
// controller-publish secret's values read for the call.
func (e *executor) runDetach(ctx context.Context, va *storagev1.VolumeAttachment, plan decide.DetachPlan, secrets map[string]string) (runner.Result, error) {
	switch {
	case plan.Done:
		return runner.Result{}, nil
	case plan.Blocked != nil:
		return e.detachBlocked(ctx, va, plan.Blocked)
	case plan.CallBlocked != nil:
		return e.notCalled(ctx, va, false, plan.CallBlocked)
	}
	callErr, err := e.unpublish(ctx, unpublication{handle: plan.Volume.Handle, nodeID: plan.NodeID,
		secrets: secrets, migrated: plan.Volume.Migrated})
	if err != nil {
		return runner.Result{}, err
	}
	if callErr != nil {
		// Whatever the code, the volume may still be attached: keep the
		// finalizer and retry.
		return e.detachFailed(ctx, va, callErr)
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
func (e *executor) unpublishRecorded(ctx context.Context, va *storagev1.VolumeAttachment, plan decide.AttachPlan, secrets map[string]string) (runner.Result, error) {
	u := plan.UnpublishFirst
	if u.Blocked != nil {
		return e.notCalled(ctx, va, true, u.Blocked)
	}
	callErr, err := e.unpublish(ctx, unpublication{handle: u.Handle, nodeID: u.NodeID,
		secrets: secrets, migrated: plan.Volume.Migrated})
	if err != nil {
		return runner.Result{}, err
	}
	if callErr != nil {
		msg, code := failure(nil, callErr)
		return e.attachFailedMsg(ctx, va, fmt.Sprintf("the CSINode of node %q now reports node ID %q; the volume recorded as published to node ID %q must be unpublished first: %s",
			va.Spec.NodeName, plan.NodeID, u.NodeID, msg), code)
	}
	klog.FromContext(ctx).Info("Unpublished the volume from the node ID recorded before the node's CSI node ID changed",
		"volumeHandle", u.Handle, "recordedNodeID", u.NodeID, "nodeID", plan.NodeID)
	return runner.Result{}, nil
}

// notCalled records why the driver was not called (blocked, decided by
// decide.BeforeCall and marked in the plan) and retries the pass as
// decide.WhenNotCalled says: an object latch does not watch (a Secret) is
// polled every secretRetryInterval; anything else is an attach failure.
func (e *executor) notCalled(ctx context.Context, va *storagev1.VolumeAttachment, attach bool, blocked *decide.Blocked) (runner.Result, error) {
	if decide.WhenNotCalled(blocked) != decide.RetryPoll {
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
	return attachFailure(ctx, va, reasonOf(blocked), msg, blocked != nil && blocked.Reason.Class() == decide.ClassTerminal)
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
func attachFailure(ctx context.Context, va *storagev1.VolumeAttachment, reason decide.Reason, msg string, terminal bool) (runner.Result, error) {
	klog.FromContext(ctx).V(2).Info("Attach failed", "reason", reason, "err", msg)
	err := fmt.Errorf("attach VolumeAttachment %q: %s", va.Name, msg)
	if terminal {
		return runner.Result{}, runner.Terminal(err)
	}
	return runner.Result{}, err
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

// detachFailed records a failed ControllerUnpublish (callErr) of a
// detach and retries the pass as decide.AfterUnpublishFailed says from
// its gRPC code: after the backend's latency when it pushed back, with
// backoff otherwise.
func (e *executor) detachFailed(ctx context.Context, va *storagev1.VolumeAttachment, callErr error) (runner.Result, error) {
	msg, code := failure(nil, callErr)
	if err := e.recordError(ctx, va, false, msg, code); err != nil {
		return runner.Result{}, err
	}
	if decide.AfterUnpublishFailed(codeOf(callErr)) == decide.RetryThrottled {
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

// writeFailed returns a refused API write's error for the runner's
// backoff, recorded first when decide.RecordRefusedWrite says so from the
// error's API status: in status.attachError (attach: a PV finalizer or VA
// metadata write, with an AttachFailed event) or status.detachError
// (detach: the finalizer removal after a successful unpublish, with a
// DetachFailed event), so that a write that keeps failing, for missing
// RBAC say, is shown on the VolumeAttachment instead of only in our log.
// After a detach's unpublish the next pass unpublishes again (idempotent)
// and retries the removal.
func (e *executor) writeFailed(ctx context.Context, va *storagev1.VolumeAttachment, attach bool, err error) (runner.Result, error) {
	if !decide.RecordRefusedWrite(apiStatusOf(err)) {
		return runner.Result{}, err
	}
	if rerr := e.recordError(ctx, va, attach, err.Error(), nil); rerr != nil {
		klog.FromContext(ctx).Error(rerr, "Record a refused write in the VolumeAttachment's status", "attach", attach)
	}
	return runner.Result{}, err
}

// apiStatusOf is the API status an error carries (wrapped or not), as
// decide.RecordRefusedWrite takes it: the zero Status when it carries none.
func apiStatusOf(err error) metav1.Status {
	var s apierrors.APIStatus
	if errors.As(err, &s) {
		return s.Status()
	}
	return metav1.Status{}
}
