package attacher_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// What latch recorded against what it sees now: a node replaced under the
// same name (its CSINode reports a new node ID) and a status.attached=true
// written by another client.

// replaceCSINode stands for a node replaced under the same name: the
// kubelet of the new node re-creates its CSINode (a driver's node ID is
// immutable) and the driver registers a new node ID.
func (e *env) replaceCSINode(node, nodeID string) {
	e.t.Helper()
	if err := e.client.StorageV1().CSINodes().Delete(e.ctx, node, metav1.DeleteOptions{}); err != nil {
		e.t.Fatalf("delete CSINode %s: %v", node, err)
	}
	e.eventually(10*time.Second, "CSINode "+node+" gone", func() (bool, error) {
		_, err := e.client.StorageV1().CSINodes().Get(e.ctx, node, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	e.createCSINode(node, nodeID)
}

func unpublishNodeIDs(d *csimock.Driver, volume string) []string {
	var out []string
	for _, c := range d.CallsTo("ControllerUnpublishVolume") {
		if c.VolumeID == volume {
			out = append(out, c.NodeID)
		}
	}
	return out
}

// The node is replaced under the same name and its CSINode now reports a
// new node ID: the detach unpublishes the ID the volume was published
// with, and the attached VA's record is not rewritten meanwhile.
func TestDetachAfterNodeReplacedUnpublishesTheRecordedNodeID(t *testing.T) {
	e := newEnv(t, envOptions{})
	pv, vaName, _ := e.attachOne(30 * time.Second)

	newID := e.nodeID + "-new"
	e.replaceCSINode(e.node, newID)
	time.Sleep(time.Second) // the attacher sees the CSINode change
	if got := e.getVA(vaName).Annotations[kubenames.VANodeIDAnnotation]; got != e.nodeID {
		t.Fatalf("node-id annotation of the attached VA = %q, want the one it was published with, %q", got, e.nodeID)
	}
	if n := len(e.driver.CallsTo("ControllerPublishVolume")); n != 1 {
		t.Fatalf("ControllerPublish calls = %d, want 1 (an attached VA is not moved)", n)
	}

	e.deleteVA(vaName)
	e.waitGone(vaName)
	if got := unpublishNodeIDs(e.driver, pv); !slices.Equal(got, []string{e.nodeID}) {
		t.Fatalf("ControllerUnpublish node IDs = %v, want [%s]", got, e.nodeID)
	}
	if got := e.driver.Published(pv); len(got) != 0 {
		t.Fatalf("volume still published to %v after detach", got)
	}
}

// A publish that reached the backend but whose reply was lost leaves the VA
// not attached, with the old node ID recorded; the node is then replaced.
// The next attach unpublishes the old ID before recording and publishing
// the new one: the driver ends with exactly one publication, to the new ID.
func TestReattachAfterNodeIDChangeUnpublishesTheRecordedIDFirst(t *testing.T) {
	e := newEnv(t, envOptions{})
	pv, vaName := e.prefix+"-pv", e.prefix+"-va"
	id, err := e.driver.AddFault(csimock.Rule{Method: "ControllerPublishVolume", VolumeID: pv, Phase: csimock.PhaseAfter, Code: codes.Unavailable, Message: "reply lost"})
	if err != nil {
		t.Fatal(err)
	}
	e.createPV(pv)
	e.createVA(e.newVA(vaName, pv, e.node))
	e.waitAttachError(vaName, "reply lost")
	if got := e.driver.Published(pv); !slices.Equal(got, []string{e.nodeID}) {
		t.Fatalf("backend publications = %v, want [%s] (the lost reply)", got, e.nodeID)
	}

	newID := e.nodeID + "-new"
	e.replaceCSINode(e.node, newID)
	e.driver.RemoveFault(id)
	va := e.waitAttached(vaName, 30*time.Second)
	if got := va.Annotations[kubenames.VANodeIDAnnotation]; got != newID {
		t.Fatalf("node-id annotation = %q, want %q", got, newID)
	}
	if got := e.driver.Published(pv); !slices.Equal(got, []string{newID}) {
		t.Fatalf("backend publications = %v, want only [%s]", got, newID)
	}
	if got := unpublishNodeIDs(e.driver, pv); !slices.Equal(got, []string{e.nodeID}) {
		t.Fatalf("ControllerUnpublish node IDs = %v, want [%s]", got, e.nodeID)
	}
	e.deleteVA(vaName)
	e.waitGone(vaName)
	if got := e.driver.Published(pv); len(got) != 0 {
		t.Fatalf("volume still published to %v after detach", got)
	}
}

// markAttachedByOther writes status.attached=true with an attachError, as
// a client other than latch could, on a VA latch never published.
func (e *env) markAttachedByOther(name string) {
	e.t.Helper()
	va := e.getVA(name)
	va.Status.Attached = true
	va.Status.AttachError = &storagev1.VolumeError{Time: metav1.Now(), Message: "stale error written by someone else"}
	if _, err := e.client.StorageV1().VolumeAttachments().UpdateStatus(e.ctx, va, metav1.UpdateOptions{}); err != nil {
		e.t.Fatalf("mark VolumeAttachment %s attached: %v", name, err)
	}
}

func (e *env) waitAttachedClean(name string) *storagev1.VolumeAttachment {
	e.t.Helper()
	var va *storagev1.VolumeAttachment
	e.eventually(30*time.Second, "VolumeAttachment "+name+" published by us (finalizer, node ID, no attachError)", func() (bool, error) {
		var err error
		va, err = e.client.StorageV1().VolumeAttachments().Get(e.ctx, name, metav1.GetOptions{})
		return err == nil && va.Status.Attached && va.Status.AttachError == nil &&
			slices.Contains(va.Finalizers, kubenames.AttacherFinalizer(e.name)) && va.Annotations[kubenames.VANodeIDAnnotation] == e.nodeID, nil
	})
	return va
}

// status.attached=true written by another client before the attacher
// starts: latch does not trust it; it publishes once and writes its own
// status, clearing the stale attachError.
func TestForeignAttachedClaimBeforeStartIsPublished(t *testing.T) {
	e := newEnv(t, envOptions{noAttacher: true})
	pv, vaName := e.prefix+"-pv", e.prefix+"-va"
	e.createPV(pv)
	e.createVA(e.newVA(vaName, pv, e.node))
	e.markAttachedByOther(vaName)
	e.stopAtt = e.startAttacher(envOptions{}, "")

	va := e.waitAttachedClean(vaName)
	time.Sleep(time.Second) // no second publish follows
	if got := e.driver.PublishCount(pv, e.nodeID); got != 1 {
		t.Fatalf("ControllerPublish calls = %d, want 1", got)
	}
	if len(va.Status.AttachmentMetadata) == 0 {
		t.Fatalf("attachmentMetadata empty: the driver's publish context was not recorded")
	}
	e.deleteVA(vaName)
	e.waitGone(vaName)
	if got := e.driver.Published(pv); len(got) != 0 {
		t.Fatalf("volume still published to %v after detach", got)
	}
}

// The same claim written while the driver's CSINode is missing: latch
// waits for it, then publishes once and clears the attachError.
func TestForeignAttachedClaimWhileCSINodeMissingIsPublished(t *testing.T) {
	e := newEnv(t, envOptions{noCSINode: true})
	pv, vaName := e.prefix+"-pv", e.prefix+"-va"
	e.createPV(pv)
	e.createVA(e.newVA(vaName, pv, e.node))
	e.waitAttachError(vaName, "CSINode")
	e.markAttachedByOther(vaName)
	time.Sleep(500 * time.Millisecond)
	e.createCSINode(e.node, e.nodeID)

	e.waitAttachedClean(vaName)
	time.Sleep(time.Second)
	if got := e.driver.PublishCount(pv, e.nodeID); got != 1 {
		t.Fatalf("ControllerPublish calls = %d, want 1", got)
	}
}

// A VA attached by upstream's external-attacher before the swap (our
// finalizer and node-id annotation, no latch annotations) is believed: no
// publish, only the handle annotation is added.
func TestUpstreamAttachedVAIsBelievedWithoutPublish(t *testing.T) {
	e := newEnv(t, envOptions{noAttacher: true})
	pv, vaName := e.prefix+"-pv", e.prefix+"-va"
	e.createPV(pv)
	va := e.newVA(vaName, pv, e.node)
	va.Finalizers = []string{kubenames.AttacherFinalizer(e.name)}
	va.Annotations = map[string]string{kubenames.VANodeIDAnnotation: e.nodeID}
	e.createVA(va)
	va = e.getVA(vaName)
	va.Status.Attached = true
	if _, err := e.client.StorageV1().VolumeAttachments().UpdateStatus(e.ctx, va, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.stopAtt = e.startAttacher(envOptions{}, "")
	e.eventually(30*time.Second, "handle annotation recorded", func() (bool, error) {
		v, err := e.client.StorageV1().VolumeAttachments().Get(e.ctx, vaName, metav1.GetOptions{})
		return err == nil && v.Annotations["attacher.latch.dev/volume-handle"] == pv, nil
	})
	time.Sleep(500 * time.Millisecond)
	if n := len(e.driver.CallsTo("ControllerPublishVolume")); n != 0 {
		t.Fatalf("ControllerPublish calls = %d, want 0 for an attachment upstream recorded", n)
	}
	if v := e.getVA(vaName); !v.Status.Attached || v.Status.AttachError != nil {
		t.Fatalf("status = %+v, want attached without error", v.Status)
	}
}

// longText is a driver error text of n bytes.
func longText(n int) string {
	s := strings.Repeat("the backend refused: quota exceeded; ", n/37+1)
	return s[:n]
}
