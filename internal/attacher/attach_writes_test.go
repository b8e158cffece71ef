package attacher

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"k8s.io/apimachinery/pkg/types"

	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/kube/kubenames"
)

func TestExecutorAttachOfPVBackedVAWritesPVFinalizerThenVAMetadataThenStatus(t *testing.T) {
	f := newExecFixture(t, execPV("pv-a"), execVA("va-a", "pv-a"), execCSINode())
	pvRV, vaRV := f.pv("pv-a").ResourceVersion, f.va("va-a").ResourceVersion

	if _, err := f.ctrl.syncAttach(f.ctx, "va-a"); err != nil {
		t.Fatalf("syncAttach: %v", err)
	}
	w := f.requireWrites(
		"patch persistentvolumes pv-a",
		"patch volumeattachments va-a",
		"patch volumeattachments/status va-a",
	)
	fin := kubenames.AttacherFinalizer(execDriver)
	requirePatch(t, w[0], types.JSONPatchType, `[
		{"op":"test","path":"/metadata/resourceVersion","value":"`+pvRV+`"},
		{"op":"add","path":"/metadata/finalizers","value":["`+kubenames.PVFinalizer(execDriver)+`"]}]`)
	requirePatch(t, w[1], types.JSONPatchType, `[
		{"op":"test","path":"/metadata/resourceVersion","value":"`+vaRV+`"},
		{"op":"add","path":"/metadata/finalizers","value":["`+fin+`"]},
		{"op":"add","path":"/metadata/annotations","value":{"`+AnnVolumeHandle+`":"handle-pv-a","`+kubenames.VANodeIDAnnotation+`":"node-1-id"}}]`)
	f.requireCSICalls("ControllerPublishVolume handle-pv-a node-1-id OK")
	pub := f.driver.State().Volumes[0].Published[0]
	metadata, _ := json.Marshal(pub.PublishContext)
	requirePatch(t, w[2], types.MergePatchType, `{"metadata":{"uid":"uid-va-a"},"status":{"attached":true,"attachmentMetadata":`+string(metadata)+`}}`)

	va := f.va("va-a")
	if !va.Status.Attached || !reflect.DeepEqual(va.Status.AttachmentMetadata, pub.PublishContext) || va.Status.AttachError != nil {
		t.Errorf("VA status = %+v, want attached with the publish context %v", va.Status, pub.PublishContext)
	}
	if !slices.Equal(va.Finalizers, []string{fin}) || va.Annotations[kubenames.VANodeIDAnnotation] != "node-1-id" {
		t.Errorf("VA metadata: finalizers %v annotations %v", va.Finalizers, va.Annotations)
	}

	// A second pass right away, whether or not the informer has caught up
	// with our writes, publishes nothing and writes nothing.
	f.client.ClearActions()
	if _, err := f.ctrl.syncAttach(f.ctx, "va-a"); err != nil {
		t.Fatalf("second syncAttach: %v", err)
	}
	f.requireWrites()
	f.requireCSICalls("ControllerPublishVolume handle-pv-a node-1-id OK")
	if n := len(f.recorder.Events); n != 0 {
		t.Errorf("%d events recorded for a successful attach", n)
	}
}

func TestExecutorAttachFailureRecordsAttachErrorWithCodeAndOneEvent(t *testing.T) {
	f := newExecFixture(t, execPV("pv-a"), execVA("va-a", "pv-a"), execCSINode())
	if _, err := f.driver.AddFault(csimock.Rule{Method: "ControllerPublishVolume", Code: codes.Aborted, Message: "no free slots"}); err != nil {
		t.Fatal(err)
	}
	_, err := f.ctrl.syncAttach(f.ctx, "va-a")
	if err == nil || !strings.Contains(err.Error(), "no free slots") {
		t.Fatalf("syncAttach error = %v, want the driver's error for the retry", err)
	}
	w := f.requireWrites(
		"patch persistentvolumes pv-a",
		"patch volumeattachments va-a",
		"patch volumeattachments/status va-a",
	)
	f.requireCSICalls("ControllerPublishVolume handle-pv-a node-1-id Aborted")
	var status struct {
		Metadata map[string]any `json:"metadata"`
		Status   map[string]struct {
			Message   string `json:"message"`
			ErrorCode *int32 `json:"errorCode"`
			Time      string `json:"time"`
		} `json:"status"`
	}
	if err := json.Unmarshal([]byte(w[2].Patch), &status); err != nil {
		t.Fatal(err)
	}
	ae, ok := status.Status["attachError"]
	if len(status.Status) != 1 || !ok || !strings.Contains(ae.Message, "no free slots") || ae.ErrorCode == nil || *ae.ErrorCode != int32(codes.Aborted) || ae.Time == "" {
		t.Errorf("status patch = %s, want only attachError with the message, time and errorCode %d", w[2].Patch, codes.Aborted)
	}
	va := f.va("va-a")
	if va.Status.Attached || va.Status.AttachError == nil || *va.Status.AttachError.ErrorCode != int32(codes.Aborted) {
		t.Errorf("VA status = %+v", va.Status)
	}
	if !slices.Contains(va.Finalizers, kubenames.AttacherFinalizer(execDriver)) {
		t.Errorf("finalizer missing after a publish that may have happened: %v", va.Finalizers)
	}
	if ev := drainEvents(f.recorder); len(ev) != 1 || !strings.HasPrefix(ev[0], "Warning "+EventAttachFailed) || !strings.Contains(ev[0], "no free slots") {
		t.Errorf("events = %q, want one Warning %s", ev, EventAttachFailed)
	}

	// The retry fails the same way: one more publish, no write, no event.
	f.updateVA(f.va("va-a"))
	f.client.ClearActions()
	if _, err := f.ctrl.syncAttach(f.ctx, "va-a"); err == nil {
		t.Fatal("retry succeeded, want the same failure")
	}
	f.requireWrites()
	if n := len(f.driver.CallsTo("ControllerPublishVolume")); n != 2 {
		t.Errorf("publish calls = %d, want 2", n)
	}
	if ev := drainEvents(f.recorder); len(ev) != 0 {
		t.Errorf("retry with the same error recorded events %q", ev)
	}
}
