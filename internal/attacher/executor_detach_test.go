package attacher

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"

	"github.com/latchcsi/latch/internal/csi"
	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/kube/kubenames"
)

func TestExecutorDetachUnpublishesThenRemovesFinalizerThenWritesStatus(t *testing.T) {
	// Another finalizer keeps the object after ours goes: the status write
	// tells its owner the volume is detached.
	va := deleting(attachedVA("va-d", "pv-d", "example.com/other"))
	f := newExecFixture(t, execPV("pv-d"), va, execCSINode())
	capability, err := csi.VolumeCapability(csi.CapabilityInput{AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}, FSType: "ext4"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.driver.SeedPublication("handle-pv-d", "node-1-id", false, capability); err != nil {
		t.Fatal(err)
	}
	if _, err := f.ctrl.syncDetach(f.ctx, "va-d"); err != nil {
		t.Fatalf("syncDetach: %v", err)
	}
	w := f.requireWrites(
		"patch volumeattachments va-d",
		"patch volumeattachments/status va-d",
	)
	f.requireCSICalls("ControllerUnpublishVolume handle-pv-d node-1-id OK")
	requirePatch(t, w[0], types.JSONPatchType, `[
		{"op":"test","path":"/metadata/finalizers","value":["`+kubenames.AttacherFinalizer(execDriver)+`","example.com/other"]},
		{"op":"replace","path":"/metadata/finalizers","value":["example.com/other"]}]`)
	requirePatch(t, w[1], types.MergePatchType, `{"metadata":{"uid":"uid-va-d"},"status":{"attached":false,"attachmentMetadata":null}}`)
	if got := f.driver.Published("handle-pv-d"); len(got) != 0 {
		t.Errorf("still published to %v", got)
	}
	if got := f.va("va-d"); got.Status.Attached || slices.Contains(got.Finalizers, kubenames.AttacherFinalizer(execDriver)) {
		t.Errorf("VA after detach: finalizers %v status %+v", got.Finalizers, got.Status)
	}
}

func TestExecutorDetachOfLastFinalizerMakesNoStatusWrite(t *testing.T) {
	va := deleting(attachedVA("va-d", "pv-d"))
	f := newExecFixture(t, execPV("pv-d"), va, execCSINode())
	if _, err := f.ctrl.syncDetach(f.ctx, "va-d"); err != nil {
		t.Fatalf("syncDetach: %v", err)
	}
	f.requireWrites("patch volumeattachments va-d")
	f.requireCSICalls("ControllerUnpublishVolume handle-pv-d node-1-id OK")
}

func TestExecutorDetachFailureRecordsDetachErrorAndKeepsFinalizer(t *testing.T) {
	va := deleting(attachedVA("va-d", "pv-d"))
	f := newExecFixture(t, execPV("pv-d"), va, execCSINode())
	if _, err := f.driver.AddFault(csimock.Rule{Method: "ControllerUnpublishVolume", Code: codes.Internal, Message: "array offline"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.ctrl.syncDetach(f.ctx, "va-d"); err == nil || !strings.Contains(err.Error(), "array offline") {
		t.Fatalf("syncDetach error = %v, want the driver's error", err)
	}
	w := f.requireWrites("patch volumeattachments/status va-d")
	f.requireCSICalls("ControllerUnpublishVolume handle-pv-d node-1-id Internal")
	var patch struct {
		Status map[string]json.RawMessage `json:"status"`
	}
	if err := json.Unmarshal([]byte(w[0].Patch), &patch); err != nil {
		t.Fatal(err)
	}
	if _, ok := patch.Status["detachError"]; len(patch.Status) != 1 || !ok {
		t.Errorf("status patch = %s, want detachError only (attached stays true)", w[0].Patch)
	}
	got := f.va("va-d")
	de := got.Status.DetachError
	// Upstream never sets errorCode on detachError; the code is in the
	// message.
	if de == nil || !strings.Contains(de.Message, "array offline") || !strings.Contains(de.Message, "code = Internal") || de.ErrorCode != nil {
		t.Errorf("detachError = %+v, want the driver's message with its code, and no errorCode", de)
	}
	if strings.Contains(w[0].Patch, "errorCode") {
		t.Errorf("status patch %s writes errorCode on detachError", w[0].Patch)
	}
	if !got.Status.Attached || !slices.Contains(got.Finalizers, kubenames.AttacherFinalizer(execDriver)) {
		t.Errorf("after a failed detach: attached=%v finalizers=%v, want attached with our finalizer", got.Status.Attached, got.Finalizers)
	}
	if ev := drainEvents(f.recorder); len(ev) != 1 || !strings.HasPrefix(ev[0], "Warning "+EventDetachFailed) {
		t.Errorf("events = %q, want one Warning %s", ev, EventDetachFailed)
	}
}

func TestExecutorDeletingPVLosesFinalizerOnlyWhenNoVAReferencesIt(t *testing.T) {
	pv := deleting(execPV("pv-p"))
	pv.Finalizers = []string{"kubernetes.io/pv-protection", kubenames.PVFinalizer(execDriver)}
	f := newExecFixture(t, pv, attachedVA("va-p", "pv-p"), execCSINode())

	// A VA still refers to the PV: nothing is written.
	if _, err := f.ctrl.syncPV(f.ctx, "pv-p"); err != nil {
		t.Fatalf("syncPV: %v", err)
	}
	f.requireWrites()

	// The VA is gone (deleted outright in the tracker): the finalizer goes,
	// guarded by the PV's finalizer list, other finalizers untouched.
	if err := f.tracker.Delete(vaGVR, "", "va-p"); err != nil {
		t.Fatal(err)
	}
	f.waitFor("VA gone from the cache", func() bool {
		_, exists, err := f.vaStore.GetByKey("va-p")
		return err == nil && !exists
	})
	if _, err := f.ctrl.syncPV(f.ctx, "pv-p"); err != nil {
		t.Fatalf("syncPV: %v", err)
	}
	w := f.requireWrites("patch persistentvolumes pv-p")
	requirePatch(t, w[0], types.JSONPatchType, `[
		{"op":"test","path":"/metadata/finalizers","value":["kubernetes.io/pv-protection","`+kubenames.PVFinalizer(execDriver)+`"]},
		{"op":"replace","path":"/metadata/finalizers","value":["kubernetes.io/pv-protection"]}]`)
	f.requireCSICalls()
	if got := f.pv("pv-p").Finalizers; !slices.Equal(got, []string{"kubernetes.io/pv-protection"}) {
		t.Errorf("PV finalizers = %v", got)
	}
}

func TestExecutorPVNotDeletingKeepsFinalizer(t *testing.T) {
	pv := execPV("pv-p")
	pv.Finalizers = []string{kubenames.PVFinalizer(execDriver)}
	f := newExecFixture(t, pv, execCSINode())
	if _, err := f.ctrl.syncPV(f.ctx, "pv-p"); err != nil {
		t.Fatalf("syncPV: %v", err)
	}
	f.requireWrites()
}

func drainEvents(r *record.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-r.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// A VolumeAttachment deleted while the driver publishes it (before our
// finalizer could be on the object the delete found, e.g. a stale view
// after a restart) leaves a publication nothing would ever detach: the
// status write finds the VA gone, and the attach queue unpublishes it.
func TestExecutorVADeletedDuringPublishIsUnpublishedAgain(t *testing.T) {
	f := newExecFixture(t, execPV("pv-a"), execVA("va-a", "pv-a"), execCSINode())
	deleteOnStatusPatch(f, "va-a")
	// The first unpublish fails: the key is retried until it succeeds.
	if _, err := f.driver.AddFault(csimock.Rule{Method: "ControllerUnpublishVolume", Once: true, Code: codes.Unavailable, Message: "busy"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.ctrl.syncAttach(f.ctx, "va-a"); err == nil || !strings.Contains(err.Error(), `left behind by the deleted VolumeAttachment "va-a"`) {
		t.Fatalf("syncAttach = %v, want the failed unpublish of the orphaned publication", err)
	}
	f.requireCSICalls("ControllerPublishVolume handle-pv-a node-1-id OK", "ControllerUnpublishVolume handle-pv-a node-1-id Unavailable")
	f.waitFor("VA gone from the cache", func() bool { _, exists, _ := f.vaStore.GetByKey("va-a"); return !exists })
	if _, err := f.ctrl.syncAttach(f.ctx, "va-a"); err != nil {
		t.Fatalf("retry: %v", err)
	}
	f.requireCSICalls("ControllerPublishVolume handle-pv-a node-1-id OK", "ControllerUnpublishVolume handle-pv-a node-1-id Unavailable",
		"ControllerUnpublishVolume handle-pv-a node-1-id OK")
	for _, vol := range f.driver.State().Volumes {
		if len(vol.Published) != 0 {
			t.Fatalf("volume %s still published to %+v", vol.ID, vol.Published)
		}
	}
	// Nothing left to do.
	if _, err := f.ctrl.syncAttach(f.ctx, "va-a"); err != nil {
		t.Fatalf("third pass: %v", err)
	}
	if n := len(f.csiCalls()); n != 3 {
		t.Errorf("CSI calls after the cleanup = %d, want still 3", n)
	}
}

func TestDefaultAPIWorkers_twoHundredOrTwoPerCSISlot(t *testing.T) {
	for _, c := range []struct{ workers, want int }{{1, 200}, {10, 200}, {100, 200}, {101, 202}, {500, 1000}} {
		if got := DefaultAPIWorkers(c.workers); got != c.want {
			t.Errorf("DefaultAPIWorkers(%d) = %d, want %d", c.workers, got, c.want)
		}
	}
}

// The API server deletes a VolumeAttachment whose last finalizer a patch
// removes, and answers with the object at the resourceVersion it had
// before, which the informer may still deliver late, finalizer and all.
// Neither that late event nor a pass right after it (the ListVolumes
// reconcile nudges every pending detach) may unpublish the volume again.
func TestExecutorDetachOfLastFinalizerIsNotRepeatedWhenTheDeletedVersionArrivesLate(t *testing.T) {
	f := newExecFixture(t, execPV("pv-d"), deleting(attachedVA("va-d", "pv-d")), execCSINode())
	capability, err := csi.VolumeCapability(csi.CapabilityInput{AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}, FSType: "ext4"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.driver.SeedPublication("handle-pv-d", "node-1-id", false, capability); err != nil {
		t.Fatal(err)
	}
	// The API server's answer to the finalizer removal: the object is
	// deleted, the response is the patched object at the old
	// resourceVersion. The informer is not told yet (a lagging watch).
	f.client.PrependReactor("patch", "volumeattachments", func(a clienttesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "" {
			return false, nil, nil
		}
		obj, err := f.tracker.Get(vaGVR, "", a.(clienttesting.PatchAction).GetName())
		if err != nil {
			return true, nil, err
		}
		gone := obj.(*storagev1.VolumeAttachment).DeepCopy()
		gone.Finalizers = nil
		return true, gone, nil
	})
	lateEvent := f.va("va-d")

	if _, err := f.ctrl.syncDetach(f.ctx, "va-d"); err != nil {
		t.Fatalf("syncDetach: %v", err)
	}
	f.requireCSICalls("ControllerUnpublishVolume handle-pv-d node-1-id OK")
	f.ctrl.vaChanged(nil, lateEvent)
	if _, err := f.ctrl.syncDetach(f.ctx, "va-d"); err != nil {
		t.Fatalf("second syncDetach: %v", err)
	}
	f.requireCSICalls("ControllerUnpublishVolume handle-pv-d node-1-id OK")
	f.requireWrites("patch volumeattachments va-d")
}

// What we remember of our own write to a PV goes with the PV: a cluster
// that keeps deleting PVs does not keep one entry per PV it ever released.
// As on a real API server, removing the last finalizer deletes the PV and
// the answer carries the resourceVersion it had, so no later version of
// it ever reaches the informer: only its deletion can drop the entry.
func TestExecutorDeletedPVLeavesNoOwnWriteEntryBehind(t *testing.T) {
	pv := deleting(execPV("pv-p"))
	pv.Finalizers = []string{kubenames.PVFinalizer(execDriver)}
	f := newExecFixture(t, pv, execCSINode())
	f.client.PrependReactor("patch", "persistentvolumes", func(clienttesting.Action) (bool, runtime.Object, error) {
		obj, err := f.tracker.Get(pvGVR, "", "pv-p")
		if err != nil {
			return true, nil, err
		}
		gone := obj.(*v1.PersistentVolume).DeepCopy()
		gone.Finalizers = nil
		return true, gone, f.tracker.Delete(pvGVR, "", "pv-p")
	})
	entries := f.ctrl.pvCache.Len
	if _, err := f.ctrl.syncPV(f.ctx, "pv-p"); err != nil {
		t.Fatalf("syncPV: %v", err)
	}
	f.requireWrites("patch persistentvolumes pv-p")
	f.waitFor("the PV gone from the cache", func() bool {
		_, exists, err := f.pvStore.GetByKey("pv-p")
		return err == nil && !exists
	})
	f.waitFor("the PV's own-write entry dropped with the PV", func() bool { return entries() == 0 })
}

// The ListVolumes reconcile judges VAs as they were before the listing.
// One that was deleted meanwhile (and so is no longer published) is not
// "lost": it must not be marked detached or queued for a publish.
func TestReconcileDoesNotRepublishAVolumeAttachmentDeletedDuringTheListing(t *testing.T) {
	f := newExecFixture(t, execPV("pv-r"), attachedVA("va-r", "pv-r"), execCSINode())
	f.ctrl.cfg.ReconcileTimeout = 10 * time.Second
	if _, err := f.driver.AddFault(csimock.Rule{Method: "ListVolumes", Latency: 300 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- f.ctrl.reconcileOnce(f.ctx) }()
	f.waitFor("the listing in flight", func() bool { return len(f.driver.CallsTo("ListVolumes")) == 1 })
	f.updateVA(deleting(f.va("va-r")))
	f.client.ClearActions()
	if err := <-done; err != nil {
		t.Fatalf("reconcileOnce: %v", err)
	}
	f.requireWrites()
	if va := f.va("va-r"); !va.Status.Attached {
		t.Errorf("VA status = %+v, want still attached (its detach will clear it)", va.Status)
	}
}

// A detach pass may run to its end while an attach pass of the same name
// is due: it unpublished, removed our finalizer, and the object is gone.
// The attach pass must decide on what is there once it owns the name, not
// on a read made before: publishing for the gone object would leave a
// publication nothing detaches while the attach/detach controller, seeing
// the object gone, attaches the volume to another node. The pass reads
// only once it owns the name; while the detach owns it, the pass does
// nothing and the release wakes it.
func TestAttachPass_objectGoneWhileTheDetachOwnedIt_decidesNothingAndPublishesNothing(t *testing.T) {
	pending := attachedVA("va-r", "pv-r")
	pending.Status = storagev1.VolumeAttachmentStatus{} // metadata written, publish not yet confirmed
	f := newExecFixture(t, execPV("pv-r"), pending, execCSINode())
	if !f.ctrl.route.take(detachDir, "va-r") {
		t.Fatal("the detach lane cannot take va-r")
	}
	if _, err := f.ctrl.syncAttach(f.ctx, "va-r"); err != nil {
		t.Fatalf("syncAttach while the detach owns va-r: %v", err)
	}
	f.requireCSICalls()
	if err := f.tracker.Delete(vaGVR, "", "va-r"); err != nil {
		t.Fatal(err)
	}
	f.waitFor("VA gone from the cache", func() bool { _, exists, _ := f.vaStore.GetByKey("va-r"); return !exists })
	f.ctrl.route.release("va-r", nowhere)

	// The key runs again from a fresh read: the object is gone and nothing
	// was published, so that pass does nothing either.
	if _, err := f.ctrl.syncAttach(f.ctx, "va-r"); err != nil {
		t.Fatalf("syncAttach: %v", err)
	}
	f.requireCSICalls()
	for _, vol := range f.driver.State().Volumes {
		if len(vol.Published) != 0 {
			t.Fatalf("volume %s published to %+v", vol.ID, vol.Published)
		}
	}
}
