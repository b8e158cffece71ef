package attacher

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"

	"github.com/latchcsi/latch/internal/attacher/decide"
	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// Event reasons on VolumeAttachments.
const (
	EventAttachFailed = "AttachFailed"
	EventDetachFailed = "DetachFailed"
)

// executor carries out the plans of package decide: every API write and
// every CSI call an attach or detach makes goes through it, one method a
// step (addPVFinalizer, setMetadata, publish, unpublish, writeStatus,
// recordError), and runAttach / runDetach (executor_run.go) carry out a
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
	// attachSlots and detachSlots bound the CSI calls in flight per queue.
	attachSlots, detachSlots callSlots
	recorder                 record.EventRecorder
	metrics                  *Metrics
	clock                    clock.Clock
	// records keeps the orphans where a restart finds them (the
	// ConfigMap, orphanstore.go); nil when Config.OrphanNamespace is empty.
	records orphanStore
}

// readVA reads the VolumeAttachment name from the API server, not the
// cache (nil when it is gone).
func (e *executor) readVA(ctx context.Context, name string) (*storagev1.VolumeAttachment, error) {
	live, err := e.client.StorageV1().VolumeAttachments().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	return live, err
}

// listVolumes asks the driver which nodes each volume is published to
// (ListVolumes, every page of at most maxEntries), within timeout.
func (e *executor) listVolumes(ctx context.Context, timeout time.Duration, maxEntries int) (map[string][]string, error) {
	listCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return e.csi.ListVolumes(listCtx, int32(maxEntries))
}

// recordOrphan writes rec to the durable record of orphans.
func (e *executor) recordOrphan(ctx context.Context, rec orphanRecord) error {
	return e.records.Put(ctx, rec)
}

// unrecordOrphan removes rec from the durable record of orphans (only
// while the record holds that very publication).
func (e *executor) unrecordOrphan(ctx context.Context, rec orphanRecord) error {
	return e.records.Delete(ctx, rec)
}

// patchVA sends patch for va (a subresource when given) through the
// overlay of our own writes, which recognises the write's watch event as
// ours whether it comes before or after the answer (kube.OverlaidStore.Patch).
func (e *executor) patchVA(ctx context.Context, va *storagev1.VolumeAttachment, pt types.PatchType, patch []byte, subresources ...string) (*storagev1.VolumeAttachment, error) {
	return e.vaCache.Patch(va, pt, patch, func() (*storagev1.VolumeAttachment, error) {
		return e.client.StorageV1().VolumeAttachments().Patch(ctx, va.Name, pt, patch,
			metav1.PatchOptions{FieldManager: kube.AttacherFieldManager}, subresources...)
	})
}

// patchPV sends the JSON patch for pv through the overlay of our own
// writes (as patchVA).
func (e *executor) patchPV(ctx context.Context, pv *v1.PersistentVolume, patch []byte) error {
	_, err := e.pvCache.Patch(pv, types.JSONPatchType, patch, func() (*v1.PersistentVolume, error) {
		return e.client.CoreV1().PersistentVolumes().Patch(ctx, pv.Name, types.JSONPatchType, patch,
			metav1.PatchOptions{FieldManager: kube.AttacherFieldManager})
	})
	return err
}

// writeStatus patches va's status to want (nothing when equal).
func (e *executor) writeStatus(ctx context.Context, va *storagev1.VolumeAttachment, want storagev1.VolumeAttachmentStatus) error {
	_, err := e.sendStatus(ctx, va, want)
	return err
}

// sendStatus is writeStatus that also says whether a patch was sent: when
// va already shows want nothing is, and so no UID precondition is checked.
func (e *executor) sendStatus(ctx context.Context, va *storagev1.VolumeAttachment, want storagev1.VolumeAttachmentStatus) (sent bool, err error) {
	patch, err := kube.VolumeAttachmentStatusPatch(va, want)
	if err != nil || patch == nil {
		return false, err
	}
	if _, err := e.patchVA(ctx, va, types.MergePatchType, patch, "status"); err != nil {
		return true, fmt.Errorf("update status of VolumeAttachment %q: %w", va.Name, err)
	}
	return true, nil
}

// setMetadata writes the finalizer and annotations mc names in one guarded
// patch and returns the updated object (va itself when nothing changes).
func (e *executor) setMetadata(ctx context.Context, va *storagev1.VolumeAttachment, mc *decide.MetadataChange) (*storagev1.VolumeAttachment, error) {
	patch, err := metadataPatch(va, mc)
	if err != nil || patch == nil {
		return va, err
	}
	updated, err := e.patchVA(ctx, va, types.JSONPatchType, patch)
	if err != nil {
		return nil, fmt.Errorf("add finalizer and node ID to VolumeAttachment %q: %w", va.Name, err)
	}
	return updated, nil
}

// addPVFinalizer puts our finalizer on pv (nothing when it is there).
func (e *executor) addPVFinalizer(ctx context.Context, pv *v1.PersistentVolume) error {
	patch, err := kube.AddFinalizerPatch(pv, kubenames.PVFinalizer(e.driver.Name))
	if err != nil || patch == nil {
		return err
	}
	if err := e.patchPV(ctx, pv, patch); err != nil {
		return fmt.Errorf("add finalizer to PersistentVolume %q: %w", pv.Name, err)
	}
	return nil
}

// releaseVA removes our finalizer after a successful unpublish. When other
// finalizers keep the object alive, status.attached is set to false too;
// when ours was the last, the object is gone and no status write is made.
func (e *executor) releaseVA(ctx context.Context, va *storagev1.VolumeAttachment) error {
	patch, err := kube.RemoveFinalizerPatch(va, kubenames.AttacherFinalizer(e.driver.Name))
	if err != nil {
		return err
	}
	if patch == nil {
		// Our finalizer was gone already (an unpublish the ListVolumes
		// reconcile asked for): only the status is left to say detached.
		if !va.Status.Attached && va.Status.DetachError == nil {
			return nil
		}
		return e.writeStatus(ctx, va, storagev1.VolumeAttachmentStatus{Attached: false})
	}
	updated, err := e.patchVA(ctx, va, types.JSONPatchType, patch)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove finalizer from VolumeAttachment %q: %w", va.Name, err)
	}
	if len(updated.Finalizers) == 0 {
		return nil
	}
	return e.writeStatus(ctx, updated, storagev1.VolumeAttachmentStatus{Attached: false})
}

// recordError writes status.attachError (attach, with errorCode code) or
// status.detachError (without errorCode, as upstream) and a Warning event,
// only when the message changes, so retries do not rewrite them. It
// returns only a failure to write.
func (e *executor) recordError(ctx context.Context, va *storagev1.VolumeAttachment, attach bool, msg string, code *int32) error {
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
	verr := &storagev1.VolumeError{Time: metav1.NewTime(e.clock.Now()), Message: msg}
	if attach {
		verr.ErrorCode = code
		status.AttachError = verr
	} else {
		// Upstream sets errorCode on attachError only (its
		// MutableCSINodeAllocatableCount gate covers attach; a detach
		// error never gets one): the code stays in the message.
		status.DetachError = verr
	}
	if err := e.writeStatus(ctx, va, status); err != nil {
		return err
	}
	e.recorder.Event(va, v1.EventTypeWarning, reason, msg)
	return nil
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
