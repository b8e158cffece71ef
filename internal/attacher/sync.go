package attacher

import (
	"context"
	"fmt"
	"slices"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

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

// syncAttach is one level-based attach pass for the VolumeAttachment name.
func (c *Controller) syncAttach(ctx context.Context, name string) (runner.Result, error) {
	va, err := c.getVA(name)
	if err != nil {
		return runner.Result{}, err
	}
	if va == nil {
		// Gone: only a publication it left behind may need undoing.
		_, res, err := c.settleOrphan(ctx, name, nil)
		return res, err
	}
	// A publication left by an earlier VolumeAttachment of this name is
	// undone (or handed over to this one) before this one is worked on.
	if cont, res, err := c.settleOrphan(ctx, name, va); !cont {
		return res, err
	}
	if va.DeletionTimestamp != nil {
		c.detach.Enqueue(name)
		return runner.Result{}, nil
	}
	if !c.claims.claim(attachDir, name) {
		// The detach queue works on it; its release wakes this key.
		return runner.Result{}, nil
	}
	defer c.claims.release(name)
	ctx = klog.NewContext(ctx, klog.FromContext(ctx).WithValues("volumeAttachment", klog.KObj(va), "node", va.Spec.NodeName))

	obs, err := c.observe(va)
	if err != nil {
		return runner.Result{}, err
	}
	plan := decide.Attach(obs, c.cfg.Driver, bindTranslator(c.tr, klog.FromContext(ctx)))
	switch {
	case plan.Trivial:
		return runner.Result{}, c.writeStatus(ctx, va, storagev1.VolumeAttachmentStatus{Attached: true, AttachmentMetadata: va.Status.AttachmentMetadata})
	case plan.Done:
		return runner.Result{}, nil
	case plan.Blocked != nil:
		return c.attachFailed(ctx, va, plan.Blocked, nil)
	}

	if plan.AddPVFinalizer != "" {
		if err := c.addPVFinalizer(ctx, obs.PV); err != nil {
			return c.writeFailed(ctx, va, true, err)
		}
	}
	if plan.UnpublishFirst != nil {
		// The node ID is about to be rewritten: undo the publication
		// recorded under the old one while the record still names it.
		if res, err := c.unpublishRecorded(ctx, va, plan); err != nil || res.RequeueAfter > 0 {
			return res, err
		}
	}
	if plan.Metadata != nil {
		// Finalizer and node ID go on the VA before the driver is called:
		// once a publish may have happened, a delete must wait for us.
		updated, err := c.patchVAMetadata(ctx, va, plan.Metadata)
		if err != nil {
			return c.writeFailed(ctx, va, true, err)
		}
		va = updated
	}
	if !plan.Publish {
		return runner.Result{}, nil
	}

	secrets, facts, err := c.secrets(ctx, plan.Volume.Secret)
	if err != nil {
		return runner.Result{}, err
	}
	capability, capErr := csi.VolumeCapability(csi.CapabilityInput{
		AccessModes: plan.Volume.AccessModes, Block: plan.Volume.Block, FSType: plan.Volume.FSType,
		MountOptions: plan.Volume.MountOptions, SingleNodeMultiWriter: c.cfg.Driver.SupportsSingleNodeMultiWriter,
	})
	facts.CapabilityErr = capErr
	if blocked := decide.BeforeCall(facts); blocked != nil {
		return c.notCalled(ctx, va, true, blocked)
	}

	release, err := c.attachSlots.acquire(ctx)
	if err != nil {
		return runner.Result{}, err
	}
	callCtx, cancel := context.WithTimeout(csi.WithMigrated(ctx, plan.Volume.Migrated), c.cfg.Timeout)
	publishContext, err := c.csi.ControllerPublish(callCtx, csi.PublishRequest{
		VolumeID:      plan.Volume.Handle,
		NodeID:        plan.NodeID,
		Capability:    capability,
		ReadOnly:      plan.Volume.ReadOnly,
		VolumeContext: plan.Volume.VolumeContext,
		Secrets:       secrets,
	})
	cancel()
	release()
	if err != nil {
		c.metrics.csiError("attach", err)
		if !csi.IsFinalError(err) {
			// The driver may have published: if the VolumeAttachment went
			// away meanwhile, that possible publication is an orphan.
			return c.publishFailed(ctx, va, plan, secrets, nil, err)
		}
		// A final code: nothing was published, whatever became of va.
		return c.attachFailed(ctx, va, nil, err)
	}
	if blocked := CheckPublishContext(publishContext); blocked != nil {
		// The API server would refuse the status write: retrying would
		// only publish again and again. The finalizer stays, so a delete
		// still unpublishes.
		return c.publishFailed(ctx, va, plan, secrets, blocked, nil)
	}
	if err := c.writeStatus(ctx, va, storagev1.VolumeAttachmentStatus{Attached: true, AttachmentMetadata: publishContext}); err != nil {
		if c.vaGoneOrReplaced(ctx, va, err) {
			// The VolumeAttachment went away (or was replaced by a new
			// object of the same name) while the driver published it:
			// nothing will ever detach that publication, so undo it now
			// (and retry until it is undone).
			return c.publishedForGone(ctx, va, plan, secrets, err, false)
		}
		return runner.Result{}, err
	}
	c.metrics.attached(va.CreationTimestamp.Time, c.clock.Now())
	klog.FromContext(ctx).V(2).Info("Volume attached", "volumeHandle", plan.Volume.Handle)
	return runner.Result{}, nil
}

// syncDetach is one level-based detach pass for the VolumeAttachment name.
func (c *Controller) syncDetach(ctx context.Context, name string) (runner.Result, error) {
	va, err := c.getVA(name)
	if err != nil || va == nil {
		return runner.Result{}, err
	}
	if va.DeletionTimestamp == nil {
		c.attach.Enqueue(name)
		return runner.Result{}, nil
	}
	if !c.claims.claim(detachDir, name) {
		// The attach queue works on it; its release wakes this key.
		return runner.Result{}, nil
	}
	defer c.claims.release(name)
	ctx = klog.NewContext(ctx, klog.FromContext(ctx).WithValues("volumeAttachment", klog.KObj(va), "node", va.Spec.NodeName))

	obs, err := c.observe(va)
	if err != nil {
		return runner.Result{}, err
	}
	plan := decide.Detach(obs, c.cfg.Driver, bindTranslator(c.tr, klog.FromContext(ctx)))
	switch {
	case plan.Done:
		return runner.Result{}, nil
	case plan.Blocked != nil:
		return c.detachFailed(ctx, va, plan.Blocked.Message, nil)
	}
	secrets, facts, err := c.secrets(ctx, plan.Volume.Secret)
	if err != nil {
		return runner.Result{}, err
	}
	if blocked := decide.BeforeCall(facts); blocked != nil {
		return c.notCalled(ctx, va, false, blocked)
	}

	release, err := c.detachSlots.acquire(ctx)
	if err != nil {
		return runner.Result{}, err
	}
	callCtx, cancel := context.WithTimeout(csi.WithMigrated(ctx, plan.Volume.Migrated), c.cfg.Timeout)
	err = c.csi.ControllerUnpublish(callCtx, plan.Volume.Handle, plan.NodeID, secrets)
	cancel()
	release()
	if err != nil {
		// Whatever the code, the volume may still be attached: keep the
		// finalizer and retry.
		c.metrics.csiError("detach", err)
		return c.detachFailed(ctx, va, "", err)
	}
	if err := c.releaseVA(ctx, va); err != nil {
		return c.writeFailed(ctx, va, false, err)
	}
	klog.FromContext(ctx).V(2).Info("Volume detached", "volumeHandle", plan.Volume.Handle)
	return runner.Result{}, nil
}

// releaseVA removes our finalizer after a successful unpublish. When other
// finalizers keep the object alive, status.attached is set to false too;
// when ours was the last, the object is gone and no status write is made.
func (c *Controller) releaseVA(ctx context.Context, va *storagev1.VolumeAttachment) error {
	patch, err := kube.RemoveFinalizerPatch(va, kube.AttacherFinalizer(c.cfg.Driver.Name))
	if err != nil || patch == nil {
		return err
	}
	updated, err := c.client.StorageV1().VolumeAttachments().Patch(ctx, va.Name, types.JSONPatchType, patch,
		metav1.PatchOptions{FieldManager: kube.AttacherFieldManager})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove finalizer from VolumeAttachment %q: %w", va.Name, err)
	}
	c.vaCache.Record(va.ResourceVersion, updated)
	if len(updated.Finalizers) == 0 {
		return nil
	}
	return c.writeStatus(ctx, updated, storagev1.VolumeAttachmentStatus{Attached: false})
}

// notCalled records why the driver was not called (blocked, decided by
// decide.BeforeCall): an object latch does not watch (a Secret) is polled
// every SecretRetryInterval; anything else is an attach failure (a
// detach's blocked reasons are only secrets).
func (c *Controller) notCalled(ctx context.Context, va *storagev1.VolumeAttachment, attach bool, blocked *Blocked) (runner.Result, error) {
	if blocked.Reason.Class() != decide.ClassWaitForObject {
		return c.attachFailed(ctx, va, blocked, nil)
	}
	if err := c.recordError(ctx, va, attach, blocked.Message, nil); err != nil {
		return runner.Result{}, err
	}
	return runner.Result{RequeueAfter: c.cfg.SecretRetryInterval}, nil
}

// recordError writes status.attachError (attach) or status.detachError
// and a Warning event, only when the message changes, so retries do not
// rewrite them. It returns only a failure to write.
func (c *Controller) recordError(ctx context.Context, va *storagev1.VolumeAttachment, attach bool, msg string, code *int32) error {
	prev, reason := va.Status.DetachError, EventDetachFailed
	if attach {
		prev, reason = va.Status.AttachError, EventAttachFailed
	}
	// The API server refuses a VolumeError message over its limit, and
	// with it the whole status write: shorten it instead.
	msg = fitMessage(msg, code, maxVolumeErrorMessageBytes)
	if prev != nil && prev.Message == msg {
		return nil
	}
	status := *va.Status.DeepCopy()
	verr := &storagev1.VolumeError{Time: metav1.NewTime(c.clock.Now()), Message: msg, ErrorCode: code}
	if attach {
		status.AttachError = verr
	} else {
		status.DetachError = verr
	}
	if err := c.writeStatus(ctx, va, status); err != nil {
		return err
	}
	c.recorder.Event(va, v1.EventTypeWarning, reason, msg)
	return nil
}

// attachFailed records a failed attach and returns the error for the
// runner's backoff (terminal when only an edit of the VA can fix it).
func (c *Controller) attachFailed(ctx context.Context, va *storagev1.VolumeAttachment, blocked *Blocked, callErr error) (runner.Result, error) {
	msg, code := failure(blocked, callErr)
	if err := c.recordError(ctx, va, true, msg, code); err != nil {
		return runner.Result{}, err
	}
	return c.attachFailure(ctx, va, blocked, msg)
}

// attachFailure logs a recorded attach failure and returns its error
// (terminal when only an edit of the VA can fix it).
func (c *Controller) attachFailure(ctx context.Context, va *storagev1.VolumeAttachment, blocked *Blocked, msg string) (runner.Result, error) {
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
func (c *Controller) publishFailed(ctx context.Context, va *storagev1.VolumeAttachment, plan decide.AttachPlan, secrets map[string]string, blocked *Blocked, callErr error) (runner.Result, error) {
	msg, code := failure(blocked, callErr)
	unchanged := va.Status.AttachError != nil && va.Status.AttachError.Message == fitMessage(msg, code, maxVolumeErrorMessageBytes)
	werr := c.recordError(ctx, va, true, msg, code)
	gone := false
	switch {
	case werr != nil:
		gone = c.vaGoneOrReplaced(ctx, va, werr)
	case unchanged:
		// recordError wrote nothing, so nothing checked the UID.
		gone = c.vaLiveGoneOrReplaced(ctx, va)
	}
	if gone {
		cause := werr
		if cause == nil {
			cause = fmt.Errorf("VolumeAttachment %q (uid %s) is gone or replaced", va.Name, va.UID)
		}
		klog.FromContext(ctx).V(2).Info("Attach failed after a possible publication for a VolumeAttachment that is gone", "reason", reasonOf(blocked), "err", msg)
		return c.publishedForGone(ctx, va, plan, secrets, fmt.Errorf("%s; then: %w", msg, cause), callErr != nil)
	}
	if werr != nil {
		return runner.Result{}, werr
	}
	return c.attachFailure(ctx, va, blocked, msg)
}

// publishedForGone makes the publication (uncertain: possible publication)
// made for va, which is gone or replaced, an orphan and tries to undo it
// at once; while that fails, the attach queue retries it under va's name
// before any VolumeAttachment of that name is worked on.
func (c *Controller) publishedForGone(ctx context.Context, va *storagev1.VolumeAttachment, plan decide.AttachPlan, secrets map[string]string, cause error, uncertain bool) (runner.Result, error) {
	c.orphanPublished(ctx, va, orphan{uid: va.UID, handle: plan.Volume.Handle, nodeID: plan.NodeID,
		nodeName: va.Spec.NodeName, secretRef: plan.Volume.Secret, secrets: secrets}, cause, uncertain)
	cur, err := c.getVA(va.Name)
	if err != nil {
		return runner.Result{}, err
	}
	_, res, err := c.settleOrphan(ctx, va.Name, cur)
	return res, err
}

// detachFailed records a failed detach and returns the error for backoff.
func (c *Controller) detachFailed(ctx context.Context, va *storagev1.VolumeAttachment, msg string, callErr error) (runner.Result, error) {
	var code *int32
	if callErr != nil {
		msg, code = failure(nil, callErr)
	}
	if err := c.recordError(ctx, va, false, msg, code); err != nil {
		return runner.Result{}, err
	}
	klog.FromContext(ctx).V(2).Info("Detach failed", "err", msg)
	return runner.Result{}, fmt.Errorf("detach VolumeAttachment %q: %s", va.Name, msg)
}

func failure(blocked *Blocked, callErr error) (string, *int32) {
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

func reasonOf(b *Blocked) Reason {
	if b == nil {
		return "DriverError"
	}
	return b.Reason
}

// writeStatus patches va's status to want (nothing when equal).
func (c *Controller) writeStatus(ctx context.Context, va *storagev1.VolumeAttachment, want storagev1.VolumeAttachmentStatus) error {
	patch, err := kube.VolumeAttachmentStatusPatch(va, want)
	if err != nil || patch == nil {
		return err
	}
	updated, err := c.client.StorageV1().VolumeAttachments().Patch(ctx, va.Name, types.MergePatchType, patch,
		metav1.PatchOptions{FieldManager: kube.AttacherFieldManager}, "status")
	if err != nil {
		return fmt.Errorf("update status of VolumeAttachment %q: %w", va.Name, err)
	}
	c.vaCache.Record(va.ResourceVersion, updated)
	return nil
}

func (c *Controller) patchVAMetadata(ctx context.Context, va *storagev1.VolumeAttachment, mc *decide.MetadataChange) (*storagev1.VolumeAttachment, error) {
	patch, err := metadataPatch(va, mc)
	if err != nil || patch == nil {
		return va, err
	}
	updated, err := c.client.StorageV1().VolumeAttachments().Patch(ctx, va.Name, types.JSONPatchType, patch,
		metav1.PatchOptions{FieldManager: kube.AttacherFieldManager})
	if err != nil {
		return nil, fmt.Errorf("add finalizer and node ID to VolumeAttachment %q: %w", va.Name, err)
	}
	c.vaCache.Record(va.ResourceVersion, updated)
	return updated, nil
}

func (c *Controller) addPVFinalizer(ctx context.Context, pv *v1.PersistentVolume) error {
	patch, err := kube.AddFinalizerPatch(pv, kube.PVFinalizer(c.cfg.Driver.Name))
	if err != nil || patch == nil {
		return err
	}
	updated, err := c.client.CoreV1().PersistentVolumes().Patch(ctx, pv.Name, types.JSONPatchType, patch,
		metav1.PatchOptions{FieldManager: kube.AttacherFieldManager})
	if err != nil {
		return fmt.Errorf("add finalizer to PersistentVolume %q: %w", pv.Name, err)
	}
	c.pvCache.Record(pv.ResourceVersion, updated)
	return nil
}

// syncPV removes our finalizer from a deleting PV once no VolumeAttachment
// refers to it. The check uses the VA informer's PV index, not a scan.
func (c *Controller) syncPV(ctx context.Context, name string) (runner.Result, error) {
	pv, err := c.getPV(name)
	if err != nil || pv == nil {
		return runner.Result{}, err
	}
	if pv.DeletionTimestamp == nil || !slices.Contains(pv.Finalizers, kube.PVFinalizer(c.cfg.Driver.Name)) {
		return runner.Result{}, nil
	}
	objs, err := c.vaInformer.GetIndexer().ByIndex(vaByPVIndex, name)
	if err != nil {
		return runner.Result{}, err
	}
	if len(objs) > 0 {
		// A VA delete event re-enqueues this PV.
		return runner.Result{}, nil
	}
	patch, err := kube.RemoveFinalizerPatch(pv, kube.PVFinalizer(c.cfg.Driver.Name))
	if err != nil || patch == nil {
		return runner.Result{}, err
	}
	updated, err := c.client.CoreV1().PersistentVolumes().Patch(ctx, name, types.JSONPatchType, patch,
		metav1.PatchOptions{FieldManager: kube.AttacherFieldManager})
	if apierrors.IsNotFound(err) {
		return runner.Result{}, nil
	}
	if err != nil {
		return runner.Result{}, fmt.Errorf("remove finalizer from PersistentVolume %q: %w", name, err)
	}
	c.pvCache.Record(pv.ResourceVersion, updated)
	klog.FromContext(ctx).V(2).Info("Removed PersistentVolume finalizer", "persistentVolume", name)
	return runner.Result{}, nil
}

// observe reads what a decision about va needs from the caches (nothing
// more in trivial mode, where no decision needs the PV or the CSINode).
func (c *Controller) observe(va *storagev1.VolumeAttachment) (decide.Observed, error) {
	obs := decide.Observed{VA: va, Trivial: c.cfg.Trivial}
	if obs.Trivial {
		return obs, nil
	}
	var err error
	if pvName := va.Spec.Source.PersistentVolumeName; pvName != nil {
		if obs.PV, err = c.getPV(*pvName); err != nil {
			return obs, err
		}
	}
	obs.CSINode, err = c.getCSINode(va.Spec.NodeName)
	return obs, err
}

func (c *Controller) getVA(name string) (*storagev1.VolumeAttachment, error) {
	va, ok, err := c.vaCache.Get(name)
	if err != nil || !ok || va.Spec.Attacher != c.cfg.Driver.Name {
		return nil, err
	}
	return va, nil
}

func (c *Controller) getPV(name string) (*v1.PersistentVolume, error) {
	pv, ok, err := c.pvCache.Get(name)
	if err != nil || !ok {
		return nil, err
	}
	return pv, nil
}

func (c *Controller) getCSINode(name string) (*storagev1.CSINode, error) {
	if name == "" {
		return nil, nil
	}
	n, err := c.nodeLister.Get(name)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	return n, err
}
