package attacher_test

import (
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/kube/kubenames"
	"github.com/latchcsi/latch/internal/testsupport"
)

// upstream: TestCSIHandler "finalizer removal fails -> controller
// retries" (the PV finalizer). The PV is deleted while attached; once its
// VolumeAttachment is gone the removal of our PV finalizer is refused
// twice (403): the error, naming the PV and the API's answer, is logged
// (a PV has no status to show it in, as upstream), the removal is retried,
// and the third attempt takes the finalizer off.
func TestFailingPVFinalizerRemovalIsLoggedAndRetriedUntilRemoved(t *testing.T) {
	e := newEnv(t, envOptions{noAttacher: true})
	tr := testsupport.NewAPITransport()
	logs := &errorLog{}
	e.startAttacherThrough(tr, "", envOptions{logger: capturingLogger(logs)})
	pv, vaName, _ := e.attachOne(30 * time.Second)
	ourFinalizer := kubenames.PVFinalizer(e.name)
	if err := e.client.CoreV1().PersistentVolumes().Delete(e.ctx, pv, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	const refusal = "injected: cannot patch persistentvolumes"
	tr.Fail(testsupport.Match{Method: "patch", Resource: "persistentvolumes", Name: pv}, 2, http.StatusForbidden, refusal)
	before := tr.Count("PATCH persistentvolumes")

	e.deleteVA(vaName)
	e.waitGone(vaName)
	e.eventually(30*time.Second, "our finalizer removed from the deleted PV", func() (bool, error) {
		obj, err := e.client.CoreV1().PersistentVolumes().Get(e.ctx, pv, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return err == nil && !slices.Contains(obj.Finalizers, ourFinalizer), err
	})
	if got := recorded(e, tr, "PATCH persistentvolumes", before+3) - before; got != 3 {
		t.Errorf("PV finalizer removals = %d, want 3 (two refused, then the one that took)", got)
	}
	if line := logs.find(fmt.Sprintf("remove finalizer from PersistentVolume %q", pv), refusal); line == "" {
		t.Errorf("no error logged naming the PV and the refusal; errors logged: %q", logLines(logs))
	}
}

// upstream: TestTrivialHandler "failed write -> controller retries". A
// driver without PUBLISH_UNPUBLISH_VOLUME: the status write that marks
// the VolumeAttachment attached is refused twice (403); it is retried
// until the VA is attached, with no driver call and no finalizer, and the
// refusal is logged naming the VA.
func TestTrivialModeRefusedStatusWriteIsRetriedUntilAttached(t *testing.T) {
	caps := csimock.AllCapabilities()
	caps.PublishUnpublishVolume = false
	e := newEnv(t, envOptions{caps: &caps, noAttacher: true})
	tr := testsupport.NewAPITransport()
	logs := &errorLog{}
	e.startAttacherThrough(tr, "", envOptions{logger: capturingLogger(logs)})
	pv, vaName := e.prefix+"-pv", e.prefix+"-va"
	const refusal = "injected: cannot patch volumeattachments/status"
	tr.Fail(testsupport.Match{Method: "patch", Resource: "volumeattachments/status", Name: vaName}, 2, http.StatusForbidden, refusal)
	e.createPV(pv)
	e.createVA(e.newVA(vaName, pv, e.node))

	va := e.waitAttached(vaName, 30*time.Second)
	if got := recorded(e, tr, "PATCH volumeattachments/status", 3); got != 3 {
		t.Errorf("status writes = %d, want 3 (two refused, then attached)", got)
	}
	if va.Status.AttachError != nil || len(va.Finalizers) != 0 {
		t.Errorf("attached VA has attachError %+v, finalizers %v; want neither", va.Status.AttachError, va.Finalizers)
	}
	if n := len(e.driver.CallsTo(publishMethod)); n != 0 {
		t.Errorf("ControllerPublish calls = %d in trivial mode, want 0", n)
	}
	if line := logs.find(vaName, refusal); line == "" {
		t.Errorf("no error logged naming the VA and the refusal; errors logged: %q", logLines(logs))
	}
}

// logLines returns the error lines logged so far.
func logLines(l *errorLog) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.lines)
}

// recorded waits until tr has recorded at least want writes of key and
// returns the count then: a test can see the object change before the
// writer's client has read the API server's answer, which is when the
// transport records the write.
func recorded(e *env, tr *testsupport.APITransport, key string, want int) int {
	e.t.Helper()
	e.eventually(10*time.Second, fmt.Sprintf("%d %s recorded", want, key), func() (bool, error) {
		return tr.Count(key) >= want, nil
	})
	return tr.Count(key)
}
