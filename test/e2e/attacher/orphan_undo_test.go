package attacher_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/component-base/metrics/legacyregistry"

	"github.com/latchcsi/latch/internal/attacher"
	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/testsupport"
)

// publishLatency holds the driver's answer to a publish that already took
// effect, long enough for a test to delete and re-create the
// VolumeAttachment meanwhile.
const publishLatency = 1500 * time.Millisecond

// delayPublish makes the next ControllerPublish of handle publish at once
// but answer only after publishLatency.
func (e *env) delayPublish(handle string) {
	e.t.Helper()
	if _, err := e.driver.AddFault(csimock.Rule{Method: "ControllerPublishVolume", VolumeID: handle, Phase: csimock.PhaseAfter, Latency: publishLatency, Once: true}); err != nil {
		e.t.Fatal(err)
	}
}

// forceDelete deletes the VolumeAttachment name the way a user who removes
// its finalizers does: gone at once, whatever the attacher is doing.
func (e *env) forceDelete(name string) {
	e.t.Helper()
	e.deleteVA(name)
	patch := []byte(`{"metadata":{"finalizers":null}}`)
	if _, err := e.client.StorageV1().VolumeAttachments().Patch(e.ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
		e.t.Fatalf("remove finalizers of VolumeAttachment %s: %v", name, err)
	}
	e.waitGone(name)
}

// waitPublished waits until the driver holds handle published to nodeID
// (the publish took effect; its answer may still be delayed).
// orphanWithFailingUnpublish attaches pv through the VolumeAttachment
// vaName on the test's node (slowly: delayPublish), then force-deletes
// the VolumeAttachment once published, with every unpublish of pv failing
// Unavailable "backend unreachable" (the returned fault rule): an orphan
// that stays. It returns the VolumeAttachment as it was.
func (e *env) orphanWithFailingUnpublish(pv, vaName string) (old *storagev1.VolumeAttachment, unpublishFault string) {
	e.t.Helper()
	e.delayPublish(pv)
	unpublishFault, err := e.driver.AddFault(csimock.Rule{Method: "ControllerUnpublishVolume", VolumeID: pv, Code: codes.Unavailable, Message: "backend unreachable"})
	if err != nil {
		e.t.Fatal(err)
	}
	e.createVA(e.newVA(vaName, pv, e.node))
	e.waitPublished(pv, e.nodeID)
	old = e.getVA(vaName)
	e.forceDelete(vaName)
	return old, unpublishFault
}

func (e *env) waitPublished(handle, nodeID string) {
	e.t.Helper()
	e.eventually(10*time.Second, fmt.Sprintf("%s published to %s", handle, nodeID), func() (bool, error) {
		return slices.Contains(e.driver.Published(handle), nodeID), nil
	})
}

// callIndex is the position of the first driver call of method for handle
// on nodeID with code, -1 when none.
func callIndex(calls []csimock.Call, method, handle, nodeID string, code codes.Code) int {
	return slices.IndexFunc(calls, func(c csimock.Call) bool {
		return c.Method == method && c.VolumeID == handle && c.NodeID == nodeID && !c.End.IsZero() && c.Code == code
	})
}

// A VolumeAttachment deleted and re-created under the same name while its
// volume is being published: the status write, which carries the UID of the
// object published for, is refused (the API server answers 422, uid is
// immutable), and that publication is an orphan. A new VolumeAttachment
// for another node gets it unpublished before its own publish; one for the
// same volume and node takes it over (no unpublish).
func TestOrphanVARecreatedUnderSameNameDuringPublish(t *testing.T) {
	e := newEnv(t, envOptions{})
	otherNode, otherNodeID := e.prefix+"-n2", e.prefix+"-n2-id"
	e.createCSINode(otherNode, otherNodeID)
	const iterations = 6
	for i := range iterations {
		sameNode := i%2 == 1
		pv, vaName := fmt.Sprintf("%s-pv%d", e.prefix, i), fmt.Sprintf("%s-va%d", e.prefix, i)
		e.createPV(pv)
		e.delayPublish(pv)
		e.createVA(e.newVA(vaName, pv, e.node))
		e.waitPublished(pv, e.nodeID)
		old := e.getVA(vaName)
		e.forceDelete(vaName)
		newNode, newNodeID := otherNode, otherNodeID
		if sameNode {
			newNode, newNodeID = e.node, e.nodeID
		}
		e.createVA(e.newVA(vaName, pv, newNode))
		replacement := e.getVA(vaName)

		if i == 0 {
			// What the attacher's status write meets: the answer to its
			// UID precondition on an object re-created under the name.
			patch := fmt.Sprintf(`{"metadata":{"uid":%q},"status":{"attached":true}}`, old.UID)
			_, err := e.client.StorageV1().VolumeAttachments().Patch(e.ctx, vaName, types.MergePatchType, []byte(patch), metav1.PatchOptions{}, "status")
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "metadata.uid") {
				t.Fatalf("status patch with the old UID on the re-created VolumeAttachment = %v, want 422 on metadata.uid", err)
			}
		}

		va := e.waitAttached(vaName, 30*time.Second)
		if va.UID != replacement.UID {
			t.Fatalf("iteration %d: attached VolumeAttachment has UID %s, want the re-created one's %s", i, va.UID, replacement.UID)
		}
		e.eventually(10*time.Second, "only the new VolumeAttachment's publication left", func() (bool, error) {
			return slices.Equal(e.driver.Published(pv), []string{newNodeID}), nil
		})
		calls := e.driver.Calls()
		unpublishOld := callIndex(calls, "ControllerUnpublishVolume", pv, e.nodeID, codes.OK)
		if sameNode {
			if unpublishOld >= 0 {
				t.Errorf("iteration %d: the re-created VolumeAttachment for the same volume and node took the publication over, yet it was unpublished", i)
			}
			continue
		}
		publishNew := callIndex(calls, "ControllerPublishVolume", pv, newNodeID, codes.OK)
		if unpublishOld < 0 || publishNew < 0 || unpublishOld > publishNew {
			t.Errorf("iteration %d: unpublish from the old node at call %d, publish to the new node at call %d; want the unpublish first", i, unpublishOld, publishNew)
		}
		if msg := e.eventMessage(vaName, attacher.EventOrphanedPublication); !strings.Contains(msg, pv) || !strings.Contains(msg, e.nodeID) {
			t.Errorf("iteration %d: %s event %q does not name the volume and node ID", i, attacher.EventOrphanedPublication, msg)
		}
	}
}

// orphanRecord reads the orphan ConfigMap of the test's driver in ns (nil
// data when there is none).
func (e *env) orphanRecord(ns string) map[string]string {
	e.t.Helper()
	cm, err := e.client.CoreV1().ConfigMaps(ns).Get(e.ctx, attacher.OrphanRecordName(e.name), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return cm.Data
}

// A publication whose VolumeAttachment was force-deleted while it was in
// flight, and whose unpublish keeps failing, survives a restart of the
// attacher: it is recorded in the ConfigMap before the unpublish is tried,
// the new attacher reads it and unpublishes once the fault clears, and the
// entry is removed. Both attachers run with deploy/'s RBAC only.
func TestOrphanSurvivesAttacherRestart(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.stopAtt()
	applyRBAC(t, e)
	const ns = "latch-system"
	cfg, err := cluster.ServiceAccountConfig(e.ctx, ns, "csi-attacher")
	if err != nil {
		t.Fatal(err)
	}
	api := testsupport.NewAPITransport()
	cfg.WrapTransport = api.Wrap
	t.Cleanup(func() {
		if denied := api.Denied(); len(denied) != 0 {
			t.Errorf("%d requests were refused for deploy/'s RBAC:\n%s", len(denied), strings.Join(denied, "\n"))
		}
	})

	for i := range 3 {
		pv, vaName, secret := fmt.Sprintf("%s-pv%d", e.prefix, i), fmt.Sprintf("%s-va%d", e.prefix, i), fmt.Sprintf("%s-s%d", e.prefix, i)
		e.createPVWithSecret(pv, secret, map[string]string{"password": "hunter2-" + secret})

		stop := e.startAttacherAs(cfg, envOptions{leader: true}, fmt.Sprintf("first-%d", i), ns)
		old, unpublishFault := e.orphanWithFailingUnpublish(pv, vaName)
		e.eventually(15*time.Second, "orphan recorded and its unpublish failed", func() (bool, error) {
			return e.orphanRecord(ns)[vaName] != "" && callIndex(e.driver.Calls(), "ControllerUnpublishVolume", pv, e.nodeID, codes.Unavailable) >= 0, nil
		})
		var rec map[string]any
		if err := json.Unmarshal([]byte(e.orphanRecord(ns)[vaName]), &rec); err != nil {
			t.Fatal(err)
		}
		if rec["volumeHandle"] != pv || rec["nodeID"] != e.nodeID || rec["uid"] != string(old.UID) || rec["secretRef"] != "default/"+secret {
			t.Errorf("orphan record = %v, want handle %s, node ID %s, uid %s, secret reference default/%s", rec, pv, e.nodeID, old.UID, secret)
		}
		if raw := e.orphanRecord(ns)[vaName]; strings.Contains(raw, "hunter2") {
			t.Errorf("orphan record %s holds the secret's value", raw)
		}
		stop()
		if !slices.Contains(e.driver.Published(pv), e.nodeID) {
			t.Fatalf("volume %s no longer published before the fault cleared", pv)
		}

		before := len(e.driver.Calls())
		stop = e.startAttacherAs(cfg, envOptions{leader: true}, fmt.Sprintf("second-%d", i), ns)
		e.eventually(15*time.Second, "the new attacher retried the unpublish", func() (bool, error) {
			return callIndex(e.driver.Calls()[before:], "ControllerUnpublishVolume", pv, e.nodeID, codes.Unavailable) >= 0, nil
		})
		e.driver.RemoveFault(unpublishFault)
		e.eventually(30*time.Second, "the new attacher unpublished the orphan and dropped its record", func() (bool, error) {
			_, recorded := e.orphanRecord(ns)[vaName]
			return len(e.driver.Published(pv)) == 0 && !recorded, nil
		})
		if callIndex(e.driver.Calls()[before:], "ControllerUnpublishVolume", pv, e.nodeID, codes.OK) < 0 {
			t.Errorf("no successful unpublish by the new attacher")
		}
		stop()
		if _, err := e.client.StorageV1().VolumeAttachments().Get(e.ctx, vaName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("VolumeAttachment %s: %v, want gone", vaName, err)
		}
	}
}

// A record that cannot be written (missing RBAC) is reported (Warning
// event naming volume and node ID, metric) and the orphan is still
// unpublished from memory once the driver recovers.
func TestOrphanRecordWriteFailureIsReportedAndKeptInMemory(t *testing.T) {
	e := newEnv(t, envOptions{noAttacher: true})
	// Every ConfigMap write is answered 403, as the API server does for
	// an attacher whose RBAC lacks the orphan record.
	tr := testsupport.NewAPITransport()
	tr.Fail(testsupport.Match{Resource: "configmaps/*"}, 0, http.StatusForbidden, "configmaps is forbidden: the test denies it")
	e.startAttacherThrough(tr, "no-record", envOptions{})

	errorsBefore := counterValue(t, "latch_attacher_orphan_record_errors_total", "operation", "put")
	pv, vaName := e.prefix+"-pv", e.prefix+"-va"
	e.createPV(pv)
	e.delayPublish(pv)
	if _, err := e.driver.AddFault(csimock.Rule{Method: "ControllerUnpublishVolume", VolumeID: pv, Times: 2, Code: codes.Unavailable, Message: "backend unreachable"}); err != nil {
		t.Fatal(err)
	}
	e.createVA(e.newVA(vaName, pv, e.node))
	e.waitPublished(pv, e.nodeID)
	e.forceDelete(vaName)
	msg := e.eventMessage(vaName, attacher.EventOrphanRecordFailed)
	if !strings.Contains(msg, pv) || !strings.Contains(msg, e.nodeID) || !strings.Contains(msg, "RBAC forbids it") || !strings.Contains(msg, kube.OrphanRecordRule("default", e.name)) {
		t.Errorf("%s event %q does not name the volume, the node ID, the cause and the Role rule", attacher.EventOrphanRecordFailed, msg)
	}
	e.eventually(30*time.Second, "the orphan unpublished from memory", func() (bool, error) {
		return len(e.driver.Published(pv)) == 0, nil
	})
	if n := len(e.driver.CallsTo("ControllerUnpublishVolume")); n != 3 {
		t.Errorf("ControllerUnpublish calls = %d, want 3 (two failed, one succeeded)", n)
	}
	if got := counterValue(t, "latch_attacher_orphan_record_errors_total", "operation", "put"); got <= errorsBefore {
		t.Errorf("latch_attacher_orphan_record_errors_total{operation=put} = %v, was %v before: the failed write is not counted", got, errorsBefore)
	}
	if data := e.orphanRecord("default"); data != nil {
		t.Errorf("orphan record exists although every write was refused: %v", data)
	}
}

// counterValue reads a counter of the process-wide registry the in-process
// attachers report to (0 when absent).
func counterValue(t *testing.T, name, label, value string) float64 {
	t.Helper()
	families, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

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
