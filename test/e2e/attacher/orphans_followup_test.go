package attacher_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/attacher"
	"github.com/latchcsi/latch/internal/csimock"
)

// orphanWaitText is the part of a waiting VolumeAttachment's attachError
// that says why it waits.
const orphanWaitText = "left by a deleted VolumeAttachment of the same name"

// attachFailedCount sums the counts of the AttachFailed events on the
// VolumeAttachment object uid whose message contains substring.
func (e *env) attachFailedCount(name, uid, substring string) int32 {
	e.t.Helper()
	events, err := e.client.CoreV1().Events("default").List(e.ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil {
		e.t.Fatal(err)
	}
	var n int32
	for _, ev := range events.Items {
		if ev.Reason == attacher.EventAttachFailed && string(ev.InvolvedObject.UID) == uid && strings.Contains(ev.Message, substring) {
			n += max(ev.Count, 1)
		}
	}
	return n
}

// A new VolumeAttachment that waits for the orphaned publication of an
// earlier one of the same name (its unpublish failing) says so in its own
// attachError and an AttachFailed event (once per message), naming the
// volume, the node ID, the old UID and the driver's error. Once the
// unpublish succeeds it attaches and the attachError is gone.
func TestOrphanWaitIsShownInNewVolumeAttachmentAttachError(t *testing.T) {
	e := newEnv(t, envOptions{})
	otherNode, otherNodeID := e.prefix+"-n2", e.prefix+"-n2-id"
	e.createCSINode(otherNode, otherNodeID)
	for i := range 3 {
		pv, vaName := fmt.Sprintf("%s-pv%d", e.prefix, i), fmt.Sprintf("%s-va%d", e.prefix, i)
		e.createPV(pv)
		old, fault := e.orphanWithFailingUnpublish(pv, vaName)
		e.createVA(e.newVA(vaName, pv, otherNode))
		replacement := e.getVA(vaName)

		va := e.waitAttachError(vaName, orphanWaitText)
		msg := va.Status.AttachError.Message
		for _, want := range []string{pv, e.nodeID, string(old.UID), "backend unreachable"} {
			if !strings.Contains(msg, want) {
				t.Errorf("iteration %d: attachError %q does not name %q", i, msg, want)
			}
		}
		if va.UID != replacement.UID || va.Status.Attached {
			t.Errorf("iteration %d: attachError on UID %s attached=%v, want on the new VolumeAttachment %s, not attached", i, va.UID, va.Status.Attached, replacement.UID)
		}
		// Several failed unpublishes: the attachError and event are not
		// rewritten for the same message.
		e.eventually(15*time.Second, "three failed unpublishes", func() (bool, error) {
			n := 0
			for _, c := range e.driver.CallsTo("ControllerUnpublishVolume") {
				if c.VolumeID == pv && c.NodeID == e.nodeID && c.Code == codes.Unavailable {
					n++
				}
			}
			return n >= 3, nil
		})
		if got := e.getVA(vaName).Status.AttachError; got == nil || got.Message != msg || !got.Time.Equal(&va.Status.AttachError.Time) {
			t.Errorf("iteration %d: attachError rewritten while the same unpublish error repeated: %+v, was %q", i, got, msg)
		}
		if callIndex(e.driver.Calls(), "ControllerPublishVolume", pv, otherNodeID, codes.OK) >= 0 {
			t.Errorf("iteration %d: the new VolumeAttachment was published while the orphan was still published", i)
		}

		e.driver.RemoveFault(fault)
		va = e.waitAttached(vaName, 30*time.Second)
		if va.UID != replacement.UID || va.Status.AttachError != nil {
			t.Errorf("iteration %d: attached VolumeAttachment UID %s attachError %+v, want %s without attachError", i, va.UID, va.Status.AttachError, replacement.UID)
		}
		if got := e.driver.Published(pv); !slices.Equal(got, []string{otherNodeID}) {
			t.Errorf("iteration %d: %s published to %v, want only %s", i, pv, got, otherNodeID)
		}
		e.eventually(10*time.Second, "the AttachFailed event recorded", func() (bool, error) {
			return e.attachFailedCount(vaName, string(replacement.UID), orphanWaitText) > 0, nil
		})
		if n := e.attachFailedCount(vaName, string(replacement.UID), orphanWaitText); n != 1 {
			t.Errorf("iteration %d: %d AttachFailed events about the orphan, want 1 (one message)", i, n)
		}
	}
}

// A ControllerPublish that takes effect in the driver but answers
// DeadlineExceeded (an outcome the attacher cannot know) while its
// VolumeAttachment is force-deleted — or force-deleted and re-created for
// another node — is an orphan like a successful one: it is unpublished and
// nothing is left published to the old node.
func TestOrphanFromPublishOfUnknownOutcomeIsUnpublished(t *testing.T) {
	e := newEnv(t, envOptions{})
	otherNode, otherNodeID := e.prefix+"-n2", e.prefix+"-n2-id"
	e.createCSINode(otherNode, otherNodeID)
	for i := range 4 {
		recreate := i%2 == 1
		pv, vaName := fmt.Sprintf("%s-pv%d", e.prefix, i), fmt.Sprintf("%s-va%d", e.prefix, i)
		e.createPV(pv)
		if _, err := e.driver.AddFault(csimock.Rule{Method: "ControllerPublishVolume", VolumeID: pv, Phase: csimock.PhaseAfter,
			Latency: publishLatency, Code: codes.DeadlineExceeded, Message: "publish took too long", Once: true}); err != nil {
			t.Fatal(err)
		}
		e.createVA(e.newVA(vaName, pv, e.node))
		e.waitPublished(pv, e.nodeID)
		e.forceDelete(vaName)
		want := []string{}
		if recreate {
			e.createVA(e.newVA(vaName, pv, otherNode))
			want = []string{otherNodeID}
		}

		e.eventually(30*time.Second, fmt.Sprintf("iteration %d: %s published to %v only", i, pv, want), func() (bool, error) {
			return slices.Equal(append([]string{}, e.driver.Published(pv)...), want), nil
		})
		calls := e.driver.Calls()
		failedPublish := callIndex(calls, "ControllerPublishVolume", pv, e.nodeID, codes.DeadlineExceeded)
		unpublish := callIndex(calls, "ControllerUnpublishVolume", pv, e.nodeID, codes.OK)
		if failedPublish < 0 || unpublish < failedPublish {
			t.Errorf("iteration %d: publish with DeadlineExceeded at call %d, unpublish from the old node at call %d; want the unpublish after it", i, failedPublish, unpublish)
		}
		if msg := e.eventMessage(vaName, attacher.EventOrphanedPublication); !strings.Contains(msg, pv) || !strings.Contains(msg, e.nodeID) {
			t.Errorf("iteration %d: %s event %q does not name the volume and node ID", i, attacher.EventOrphanedPublication, msg)
		}
		e.eventually(10*time.Second, "orphan record dropped", func() (bool, error) {
			_, recorded := e.orphanRecord("default")[vaName]
			return !recorded, nil
		})
		if recreate {
			va := e.waitAttached(vaName, 30*time.Second)
			if va.Status.AttachError != nil {
				t.Errorf("iteration %d: re-created VolumeAttachment attached with attachError %+v", i, va.Status.AttachError)
			}
			continue
		}
		if _, err := e.client.StorageV1().VolumeAttachments().Get(e.ctx, vaName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("iteration %d: VolumeAttachment %s: %v, want gone", i, vaName, err)
		}
	}
}
