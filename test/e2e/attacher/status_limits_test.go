package attacher_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/kube/kubenames"
	"github.com/latchcsi/latch/internal/testsupport"
)

// Failures that used to be silent because the status write showing them
// was itself refused, or never attempted.

// maxVolumeErrorMessage is the API server's limit on VolumeError.message
// (k8s.io/kubernetes/pkg/apis/storage/validation).
const maxVolumeErrorMessage = 1024

// A driver error of 5,000 bytes on publish and on unpublish: attachError
// and detachError are set, fit the API's limit, start with our context,
// the gRPC code and the start of the driver's text; AttachFailed and
// DetachFailed events exist.
func TestLongDriverErrorsFitInStatusAndEvents(t *testing.T) {
	e := newEnv(t, envOptions{})
	pv, vaName := e.prefix+"-pv", e.prefix+"-va"
	text := longText(5000)
	id, err := e.driver.AddFault(csimock.Rule{Method: "ControllerPublishVolume", VolumeID: pv, Code: codes.Internal, Message: text})
	if err != nil {
		t.Fatal(err)
	}
	e.createPV(pv)
	e.createVA(e.newVA(vaName, pv, e.node))

	va := e.waitAttachError(vaName, "code = Internal")
	checkFits := func(what, msg string) {
		t.Helper()
		if len(msg) > maxVolumeErrorMessage {
			t.Fatalf("%s of %d bytes exceeds the API's %d", what, len(msg), maxVolumeErrorMessage)
		}
		wantStart := "rpc error: code = Internal desc = " + text[:200]
		if !strings.Contains(msg, wantStart) || !strings.Contains(msg, "truncated") {
			t.Fatalf("%s = %q, want the code, the start of the driver's text and a truncation mark", what, msg)
		}
	}
	checkFits("attachError", va.Status.AttachError.Message)
	if va.Status.AttachError.ErrorCode == nil || *va.Status.AttachError.ErrorCode != int32(codes.Internal) {
		t.Fatalf("attachError.errorCode = %v, want %d", va.Status.AttachError.ErrorCode, codes.Internal)
	}
	checkFits("AttachFailed event", e.eventMessage(vaName, "AttachFailed"))

	e.driver.RemoveFault(id)
	e.waitAttached(vaName, 30*time.Second)
	if _, err := e.driver.AddFault(csimock.Rule{Method: "ControllerUnpublishVolume", VolumeID: pv, Code: codes.Internal, Message: text}); err != nil {
		t.Fatal(err)
	}
	e.deleteVA(vaName)
	e.eventually(30*time.Second, "detachError on "+vaName, func() (bool, error) {
		v, err := e.client.StorageV1().VolumeAttachments().Get(e.ctx, vaName, metav1.GetOptions{})
		va = v
		return err == nil && v.Status.DetachError != nil, nil
	})
	checkFits("detachError", va.Status.DetachError.Message)
	checkFits("DetachFailed event", e.eventMessage(vaName, "DetachFailed"))
	e.driver.ClearFaults()
	e.waitGone(vaName)
	if got := e.driver.Published(pv); len(got) != 0 {
		t.Fatalf("volume still published to %v", got)
	}
}

// A publish context larger than status.attachmentMetadata may hold: one
// ControllerPublish, a clear attachError, no re-publishing; deleting the
// VA unpublishes the volume and releases the VA.
func TestOversizedPublishContextIsRecordedAndNotRepublished(t *testing.T) {
	e := newEnv(t, envOptions{})
	pv, vaName := e.prefix+"-pv", e.prefix+"-va"
	e.driver.SetExtraPublishContext(map[string]string{"blob": strings.Repeat("x", 300*1024)})
	e.createPV(pv)
	// A PV that appears wakes the VAs waiting for it: let the attacher see
	// it first, so that the one pass counted below is the VA's own.
	time.Sleep(time.Second)
	e.createVA(e.newVA(vaName, pv, e.node))

	va := e.waitAttachError(vaName, "publish context of")
	if !strings.Contains(va.Status.AttachError.Message, "too large for VolumeAttachment status") {
		t.Fatalf("attachError = %q, want it to name the cause", va.Status.AttachError.Message)
	}
	time.Sleep(4 * time.Second)
	if n := len(e.driver.CallsTo("ControllerPublishVolume")); n != 1 {
		t.Fatalf("ControllerPublish calls = %d over 4 s, want exactly 1", n)
	}
	va = e.getVA(vaName)
	if va.Status.Attached || !strings.Contains(strings.Join(va.Finalizers, ","), kubenames.AttacherFinalizer(e.name)) {
		t.Fatalf("VA attached=%v finalizers=%v, want not attached and our finalizer kept", va.Status.Attached, va.Finalizers)
	}
	e.eventMessage(vaName, "AttachFailed")

	e.deleteVA(vaName)
	e.waitGone(vaName)
	if got := e.driver.Published(pv); len(got) != 0 {
		t.Fatalf("volume still published to %v after delete", got)
	}
}

// forbidPatch answers every PATCH of the named object (not its status)
// with 403, as an API server would for missing RBAC, until the rule is
// removed.
func forbidPatch(tr *testsupport.APITransport, resource, name string) testsupport.Rule {
	return tr.Fail(testsupport.Match{Method: "patch", Resource: resource, Name: name}, 0, http.StatusForbidden,
		resource+" "+name+" is forbidden: injected: cannot patch")
}

// A PV finalizer write or a VA metadata write that keeps failing (403, as
// with missing RBAC) is shown in attachError and an AttachFailed event;
// nothing is published meanwhile; once the write is allowed the volume
// attaches and the error is cleared.
func TestFailingMetadataWritesAreShownInAttachError(t *testing.T) {
	for _, tc := range []struct {
		name, resource, want string
	}{
		{name: "PV finalizer", resource: "persistentvolumes", want: "add finalizer to PersistentVolume"},
		{name: "VA finalizer and node ID", resource: "volumeattachments", want: "add finalizer and node ID to VolumeAttachment"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOptions{noAttacher: true})
			pv, vaName := e.prefix+"-pv", e.prefix+"-va"
			tr := testsupport.NewAPITransport()
			forbidden := forbidPatch(tr, tc.resource, map[string]string{"persistentvolumes": pv, "volumeattachments": vaName}[tc.resource])
			e.startAttacherThrough(tr, "", envOptions{})
			e.createPV(pv)
			e.createVA(e.newVA(vaName, pv, e.node))

			va := e.waitAttachError(vaName, tc.want)
			if !strings.Contains(va.Status.AttachError.Message, "forbidden") {
				t.Fatalf("attachError = %q, want the API's answer", va.Status.AttachError.Message)
			}
			if msg := e.eventMessage(vaName, "AttachFailed"); !strings.Contains(msg, tc.want) {
				t.Fatalf("AttachFailed event = %q, want it to name the failed write", msg)
			}
			if n := len(e.driver.CallsTo("ControllerPublishVolume")); n != 0 {
				t.Fatalf("ControllerPublish calls = %d before the finalizers could be written, want 0", n)
			}
			tr.Remove(forbidden)
			va = e.waitAttached(vaName, 30*time.Second)
			if va.Status.AttachError != nil {
				t.Fatalf("attachError %q left after the attach", va.Status.AttachError.Message)
			}
			e.deleteVA(vaName)
			e.waitGone(vaName)
		})
	}
}

// The finalizer removal that ends a detach, refused (403): the volume is
// unpublished, and the refused write is shown in detachError and a
// DetachFailed event; once allowed, the VA goes.
func TestFailingFinalizerRemovalIsShownInDetachError(t *testing.T) {
	e := newEnv(t, envOptions{noAttacher: true})
	tr := testsupport.NewAPITransport()
	e.startAttacherThrough(tr, "", envOptions{})
	pv, vaName, _ := e.attachOne(30 * time.Second)

	forbidden := forbidPatch(tr, "volumeattachments", vaName)
	e.deleteVA(vaName)
	var msg string
	e.eventually(30*time.Second, "detachError naming the refused finalizer removal", func() (bool, error) {
		v, err := e.client.StorageV1().VolumeAttachments().Get(e.ctx, vaName, metav1.GetOptions{})
		if err != nil || v.Status.DetachError == nil {
			return false, nil
		}
		msg = v.Status.DetachError.Message
		return strings.Contains(msg, "remove finalizer from VolumeAttachment"), nil
	})
	if !strings.Contains(msg, "forbidden") {
		t.Fatalf("detachError = %q, want the API's answer", msg)
	}
	if ev := e.eventMessage(vaName, "DetachFailed"); !strings.Contains(ev, "remove finalizer from VolumeAttachment") {
		t.Fatalf("DetachFailed event = %q, want it to name the refused write", ev)
	}
	tr.Remove(forbidden)
	e.waitGone(vaName)
	if got := e.driver.Published(pv); len(got) != 0 {
		t.Fatalf("volume still published to %v", got)
	}
}
