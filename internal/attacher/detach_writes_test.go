package attacher

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clienttesting "k8s.io/client-go/testing"

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
