package attacher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/adaptive"
	"github.com/latchcsi/latch/internal/attacher/decide"
	"github.com/latchcsi/latch/internal/csi"
	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// The executor's steps (executor.go runs them in a plan's order): one
// method per API write, CSI call and live read, the CSI call slots, the
// secret read and the patch and message builders they use. The Controller
// writes no object and calls no driver method but through these.

// unpublication is one ControllerUnpublish: of a detach, of a publication
// recorded under an old node ID, or of an orphan.
type unpublication struct {
	handle, nodeID string
	// secrets are the controller-publish secret's values (nil: none):
	// read by the pass for a detach, kept by an orphan from its publish
	// until a restart.
	secrets map[string]string
	// migrated labels the call's metrics as made for a migrated in-tree
	// volume.
	migrated bool
}

// volumeCapability is the CSI VolumeCapability a ControllerPublish of vol
// sends, or why it cannot be built (a fact decide.BeforeCall judges).
func volumeCapability(drv DriverInfo, vol decide.Volume) (*csipb.VolumeCapability, error) {
	return csi.VolumeCapability(csi.CapabilityInput{
		AccessModes: vol.AccessModes, Block: vol.Block, FSType: vol.FSType,
		MountOptions: vol.MountOptions, SingleNodeMultiWriter: drv.SupportsSingleNodeMultiWriter,
	})
}

// publish calls ControllerPublish for plan with secrets: an attach slot
// taken and the call bounded by the timeout. It returns the driver's
// answer, classified (decide.Published); err is a failure before the call
// (the wait for a slot). The plan allowed the call (PublishBlocked nil), so
// the capability can be built.
func (e *executor) publish(ctx context.Context, plan decide.AttachPlan, secrets map[string]string) (decide.Published, error) {
	capability, err := volumeCapability(e.driver, plan.Volume)
	if err != nil {
		return decide.Published{}, err
	}
	var publishContext map[string]string
	callErr, err := e.call(ctx, adaptive.Attach, "attach", plan.Volume.Migrated, secrets,
		func(ctx context.Context, secrets map[string]string) error {
			var err error
			publishContext, err = e.csi.ControllerPublish(ctx, csi.PublishRequest{
				VolumeID:      plan.Volume.Handle,
				NodeID:        plan.NodeID,
				Capability:    capability,
				ReadOnly:      plan.Volume.ReadOnly,
				VolumeContext: plan.Volume.VolumeContext,
				Secrets:       secrets,
			})
			return err
		})
	if err != nil {
		return decide.Published{}, err
	}
	return decide.Published{Err: callErr, Final: callErr != nil && csi.IsFinalError(callErr), Throttled: callErr != nil && decide.Throttled(codeOf(callErr)), Context: publishContext}, nil
}

// unpublish calls ControllerUnpublish for u, the one path of a detach, of
// an unpublication before a node ID is rewritten and of an orphan: a
// detach slot taken and the call bounded by the timeout. callErr is the
// driver's error; err a failure before the call (the wait for a slot).
func (e *executor) unpublish(ctx context.Context, u unpublication) (callErr, err error) {
	return e.call(ctx, adaptive.Detach, "detach", u.migrated, u.secrets,
		func(ctx context.Context, secrets map[string]string) error {
			return e.csi.ControllerUnpublish(ctx, u.handle, u.nodeID, secrets)
		})
}

// call makes one CSI call of op ("attach" or "detach") with secrets, in
// one of the call slots and within the timeout (which starts once the slot
// is held), with the migrated label. callErr is the driver's error,
// counted in the metrics; err says the call was not made (no slot before
// ctx ended).
func (e *executor) call(ctx context.Context, dir adaptive.Direction, op string, migrated bool, secrets map[string]string,
	fn func(ctx context.Context, secrets map[string]string) error) (callErr, err error) {
	slot, err := e.calls.Acquire(ctx, dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errNoSlot, err)
	}
	callCtx, cancel := context.WithTimeout(csi.WithMigrated(ctx, migrated), e.timeout)
	callErr = fn(callCtx, secrets)
	cancel()
	outcome := callOutcome(callErr, ctx.Err() != nil)
	slot.Done(outcome)
	if callErr != nil {
		e.metrics.csiError(op, callErr)
	}
	if outcome == adaptive.Throttled {
		e.metrics.throttled(op)
	}
	return callErr, nil
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

// removePVFinalizer takes our finalizer off pv (a PV already gone is
// fine).
func (e *executor) removePVFinalizer(ctx context.Context, pv *v1.PersistentVolume) error {
	patch, err := kube.RemoveFinalizerPatch(pv, kubenames.PVFinalizer(e.driver.Name))
	if err != nil || patch == nil {
		return err
	}
	err = e.patchPV(ctx, pv, patch)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove finalizer from PersistentVolume %q: %w", pv.Name, err)
	}
	klog.FromContext(ctx).V(2).Info("Removed PersistentVolume finalizer", "persistentVolume", klog.KObj(pv))
	return nil
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

// written is what our own last write of va's name returned (the overlay's
// entry), nil when the cache holds nothing of that name.
func (e *executor) written(va *storagev1.VolumeAttachment) *storagev1.VolumeAttachment {
	cur, ok, err := e.vaCache.Get(va.Name)
	if err != nil || !ok {
		return nil
	}
	return cur
}

// sight reads the VolumeAttachment name live (readVA), as
// decide.VAFate takes it.
func (e *executor) sight(ctx context.Context, name string) decide.Sighting {
	live, err := e.readVA(ctx, name)
	return decide.Sighting{Made: true, Failed: err != nil, VA: live}
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

// errNoSlot is the error call returns (wrapping the context's cause) when
// the context ends before a call slot is free: the call was not made.
var errNoSlot = errors.New("wait for a free CSI call slot")

// newCallLimiter returns the limit of CSI publish and unpublish calls in
// flight: adaptive between 2 and cfg.Workers (starting at 10), or fixed at
// cfg.Workers. The timeout of a call starts only once it holds a slot, so
// waiting for a slot never eats into --timeout. The limit is shown by
// latch_attacher_driver_concurrency_limit.
func newCallLimiter(cfg Config, m *Metrics) *adaptive.Limiter {
	workers := max(cfg.Workers, 1)
	lc := adaptive.DefaultConfig(workers)
	if cfg.DriverConcurrency == ConcurrencyFixed {
		lc = adaptive.Config{Initial: workers, Min: workers, Max: workers}
	}
	l := adaptive.NewLimiter(lc, cfg.Clock)
	l.OnLimitChange(m.driverLimitIs)
	return l
}

// callOutcome is what a CSI call's answer says about the backend's load:
// the backend pushing back (decide.Throttled: ResourceExhausted and
// Unavailable, a cloud's request limit as drivers pass it on, or a driver
// that cannot take the call); DeadlineExceeded is a call slower than
// --timeout, a latency sample; other answers, and calls our side gave up
// on, say nothing about the load.
func callOutcome(err error, gaveUp bool) adaptive.Outcome {
	if err == nil {
		return adaptive.Served
	}
	if gaveUp {
		return adaptive.Ignored
	}
	switch code := codeOf(err); {
	case decide.Throttled(code):
		return adaptive.Throttled
	case code == decide.CodeDeadlineExceeded:
		return adaptive.Served
	}
	return adaptive.Ignored
}

// codeOf is the gRPC code of a driver's answer as package decide takes it
// (decide.CodeUnknown for an error without a gRPC status).
func codeOf(err error) decide.Code {
	return decide.Code(status.Code(err))
}

// throttledRetryInterval is how long a throttled VolumeAttachment waits
// before its next try: the backend's current latency (one period of the
// limit's control), at least a second.
func (e *executor) throttledRetryInterval() time.Duration {
	return max(time.Second, e.calls.Period())
}

// maxSecretBytes bounds what is read of a Secret GET response: the API
// server stores at most 1 MiB of data per Secret; the rest is metadata.
const maxSecretBytes = 3 << 20

// readSecret reads the controller-publish secret ref names (none when
// nil) and returns its data with the facts decide.BeforeCall judges: a
// missing or forbidden secret is a fact, not an error; other read errors
// are returned and retried.
func (e *executor) readSecret(ctx context.Context, ref *v1.SecretReference) (map[string]string, decide.CallFacts, error) {
	facts := decide.CallFacts{Secret: ref}
	if ref == nil {
		return nil, facts, nil
	}
	s, err := getSecret(ctx, e.client, ref.Namespace, ref.Name)
	switch {
	case apierrors.IsNotFound(err):
		facts.SecretState = decide.SecretNotFound
		return nil, facts, nil
	case apierrors.IsForbidden(err):
		facts.SecretState, facts.SecretDenial = decide.SecretForbidden, err.Error()
		return nil, facts, nil
	case err != nil:
		return nil, facts, fmt.Errorf("get controller publish secret %s/%s: %w", ref.Namespace, ref.Name, err)
	}
	out := make(map[string]string, len(s.Data))
	for k, v := range s.Data {
		out[k] = string(v)
	}
	return out, facts, nil
}

// getSecret reads a Secret so that its data can reach no logger, whatever
// the verbosity, the log format or the ContextualLogging feature gate.
//
// client-go's Get logs response bodies itself: rest.Request's Do passes
// the body to logBody, which at -v=8 and up logs it (a hex dump for
// protobuf, the JSON text otherwise) through klog.FromContext(ctx): the
// request context's logger with contextual logging on, the global logger
// with it off. The transport's debug wrappers (-v=6 to -v=9) log URLs,
// headers and timings, never bodies. So the Secret is fetched with
// Request.Stream instead, which hands back the body of a successful
// response untouched (only an error response, a Status without secret
// data, is read and logged), and decoded here. Rate limiting, retries,
// authentication and the wire format stay client-go's.
//
// withoutAPIDumps additionally keeps the URL and headers out of the log
// when contextual logging is on.
func getSecret(ctx context.Context, client kubernetes.Interface, namespace, name string) (*v1.Secret, error) {
	ctx = withoutAPIDumps(ctx)
	rc, ok := client.CoreV1().RESTClient().(*rest.RESTClient)
	if !ok || rc == nil {
		// A fake clientset (unit tests): no HTTP, nothing logged.
		return client.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
	}
	body, err := rc.Get().Namespace(namespace).Resource("secrets").Name(name).Stream(ctx)
	if err != nil {
		return nil, err
	}
	defer body.Close()
	data, err := io.ReadAll(io.LimitReader(body, maxSecretBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read Secret %s/%s: %w", namespace, name, err)
	}
	if len(data) > maxSecretBytes {
		return nil, fmt.Errorf("read Secret %s/%s: response larger than %d bytes", namespace, name, maxSecretBytes)
	}
	obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(data, nil, &v1.Secret{})
	if err != nil {
		// The decoder's message may quote the data it choked on: say
		// only that decoding failed.
		return nil, fmt.Errorf("decode Secret %s/%s: %w", namespace, name, errSecretUndecodable)
	}
	s, ok := obj.(*v1.Secret)
	if !ok {
		return nil, fmt.Errorf("decode Secret %s/%s: got a %T", namespace, name, obj)
	}
	return s, nil
}

var errSecretUndecodable = errors.New("the API server's response is not a Secret in a known encoding")

// metadataPatch merges a finalizer patch and an annotation patch into one
// guarded JSON patch, so attach costs one metadata write instead of two.
// Both halves come from internal/kube and test the same resourceVersion;
// the second test is dropped.
func metadataPatch(obj metav1.Object, mc *decide.MetadataChange) ([]byte, error) {
	var ops []json.RawMessage
	add := func(patch []byte, err error) error {
		if err != nil || patch == nil {
			return err
		}
		var part []json.RawMessage
		if err := json.Unmarshal(patch, &part); err != nil {
			return fmt.Errorf("merge metadata patches: %w", err)
		}
		if len(ops) > 0 {
			part = part[1:] // the resourceVersion test is already there
		}
		ops = append(ops, part...)
		return nil
	}
	if mc.AddFinalizer != "" {
		if err := add(kube.AddFinalizerPatch(obj, mc.AddFinalizer)); err != nil {
			return nil, err
		}
	}
	if len(mc.SetAnnotations) > 0 {
		if err := add(kube.SetAnnotationsPatch(obj, mc.SetAnnotations)); err != nil {
			return nil, err
		}
	}
	if len(ops) == 0 {
		return nil, nil
	}
	return json.Marshal(ops)
}

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
