package attacher

import (
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clienttesting "k8s.io/client-go/testing"

	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/runner"
)

// csiNodeOf is the CSINode of node with our driver registered as nodeID.
func csiNodeOf(node, nodeID string) *storagev1.CSINode {
	return &storagev1.CSINode{
		ObjectMeta: metav1.ObjectMeta{Name: node},
		Spec:       storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{Name: execDriver, NodeID: nodeID}}},
	}
}

// addVA2OnNode2 creates va-2, of pv-a on node-2 (the attach/detach
// controller's VolumeAttachment after the Pod moved), and waits until the
// controller's cache has it.
func addVA2OnNode2(t *testing.T, f *execFixture) {
	t.Helper()
	va2 := execVA("va-2", "pv-a")
	va2.Spec.NodeName = "node-2"
	if err := f.tracker.Add(va2); err != nil {
		t.Fatal(err)
	}
	f.waitFor("va-2 in the cache", func() bool { va, _ := LookupVA(f.vaStore, "va-2"); return va != nil })
}

// forceDeleteOnFirstStatusPatch deletes the VolumeAttachment name at its
// first status write and answers NotFound, as for a VolumeAttachment whose
// finalizers were stripped while its ControllerPublish was in flight;
// later writes, and writes of other VolumeAttachments, go through.
func forceDeleteOnFirstStatusPatch(f *execFixture, name string) {
	done := false
	f.client.PrependReactor("patch", "volumeattachments", func(action clienttesting.Action) (bool, runtime.Object, error) {
		if done || action.GetSubresource() != "status" || action.(clienttesting.PatchAction).GetName() != name {
			return false, nil, nil
		}
		done = true
		if err := f.tracker.Delete(vaGVR, "", name); err != nil {
			return true, nil, err
		}
		return true, nil, apierrors.NewNotFound(vaGVR.GroupResource(), name)
	})
}

// The scenario: a ReadWriteOnce volume's VolumeAttachment on node-1
// is force-deleted while its ControllerPublish is in flight, and every
// unpublish from node-1 fails. The Pod moves to node-2; the attach/detach
// controller creates a VolumeAttachment there, under another name. The
// orphan on node-1 blocks that publish (no ControllerPublish to node-2's ID)
// and the new VolumeAttachment says why (attachError and a Warning event
// naming the volume, node-1, its node ID and the gone VolumeAttachment),
// retried; once node-1's unpublish succeeds, node-2 gets the volume. The
// driver never has it on both.
func TestOrphanOfSingleNodeVolumeBlocksPublishToAnotherNode(t *testing.T) {
	f := newExecFixture(t, execPV("pv-a"), execVA("va-1", "pv-a"), execCSINode(), csiNodeOf("node-2", "node-2-id"))
	withStore(f)
	forceDeleteOnFirstStatusPatch(f, "va-1")
	fault, err := f.driver.AddFault(csimock.Rule{Method: "ControllerUnpublishVolume", VolumeID: "handle-pv-a", Code: codes.Unavailable, Message: "backend unreachable"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.ctrl.syncAttach(f.ctx, "va-1"); err == nil {
		t.Fatal("pass of va-1 succeeded, want its orphan's failed unpublish")
	}
	f.waitFor("va-1 gone from the cache", func() bool { _, exists, _ := f.vaStore.GetByKey("va-1"); return !exists })

	addVA2OnNode2(t, f)
	drainEvents(f.recorder)
	for i := range 3 {
		_, err := f.ctrl.syncAttach(f.ctx, "va-2")
		if err == nil || runner.IsTerminal(err) {
			t.Fatalf("pass %d of va-2 = %v, want an error that is retried", i, err)
		}
		_, _ = f.ctrl.syncAttach(f.ctx, "va-1") // the orphan's retry, failing again
		if got := f.driver.Published("handle-pv-a"); !slices.Equal(got, []string{"node-1-id"}) {
			t.Fatalf("pass %d: handle-pv-a published to %v, want only node-1-id (the orphan)", i, got)
		}
	}
	for _, c := range f.csiCalls() {
		if strings.HasPrefix(c, "ControllerPublishVolume handle-pv-a node-2-id") {
			t.Fatalf("ControllerPublish to node-2 while the orphan on node-1 is still published: CSI calls %q", f.csiCalls())
		}
	}
	ae := f.va("va-2").Status.AttachError
	for _, want := range []string{"handle-pv-a", `"node-1"`, "node-1-id", `"va-1"`, "uid-va-1", "one node only"} {
		if ae == nil || !strings.Contains(ae.Message, want) {
			t.Fatalf("va-2 attachError = %+v, want it to name %s", ae, want)
		}
	}
	events := drainEvents(f.recorder)
	if n := len(slices.DeleteFunc(slices.Clone(events), func(e string) bool {
		return !strings.HasPrefix(e, "Warning "+EventAttachFailed) || !strings.Contains(e, ae.Message)
	})); n != 1 {
		t.Errorf("events = %q, want one Warning %s with the attachError", events, EventAttachFailed)
	}

	// node-1's unpublish succeeds; va-2's next pass publishes to node-2.
	f.driver.RemoveFault(fault)
	if _, err := f.ctrl.syncAttach(f.ctx, "va-1"); err != nil {
		t.Fatalf("orphan's retry: %v", err)
	}
	if _, err := f.ctrl.syncAttach(f.ctx, "va-2"); err != nil {
		t.Fatalf("va-2 after the orphan was undone: %v", err)
	}
	calls := f.csiCalls()
	unpublished := slices.Index(calls, "ControllerUnpublishVolume handle-pv-a node-1-id OK")
	published := slices.Index(calls, "ControllerPublishVolume handle-pv-a node-2-id OK")
	if unpublished < 0 || published < unpublished {
		t.Errorf("CSI calls %q: want node-1's unpublish, then node-2's publish", calls)
	}
	if got := f.driver.Published("handle-pv-a"); !slices.Equal(got, []string{"node-2-id"}) {
		t.Errorf("handle-pv-a published to %v, want node-2-id", got)
	}
	if va := f.va("va-2"); !va.Status.Attached || va.Status.AttachError != nil {
		t.Errorf("va-2 status = %+v, want attached without error", va.Status)
	}
}

// A ReadWriteMany volume may be on several nodes: an orphan on node-1 does
// not hold its publish to node-2 back.
func TestOrphanOfMultiNodeVolumeDoesNotBlockAnotherNode(t *testing.T) {
	pv := execPV("pv-a")
	pv.Spec.AccessModes = []v1.PersistentVolumeAccessMode{v1.ReadWriteMany}
	f := newExecFixture(t, pv, execVA("va-1", "pv-a"), execCSINode(), csiNodeOf("node-2", "node-2-id"))
	withStore(f)
	forceDeleteOnFirstStatusPatch(f, "va-1")
	if _, err := f.driver.AddFault(csimock.Rule{Method: "ControllerUnpublishVolume", VolumeID: "handle-pv-a", Code: codes.Unavailable, Message: "backend unreachable"}); err != nil {
		t.Fatal(err)
	}
	_, _ = f.ctrl.syncAttach(f.ctx, "va-1")
	addVA2OnNode2(t, f)
	if _, err := f.ctrl.syncAttach(f.ctx, "va-2"); err != nil {
		t.Fatalf("va-2: %v", err)
	}
	if !slices.Contains(f.csiCalls(), "ControllerPublishVolume handle-pv-a node-2-id OK") {
		t.Errorf("CSI calls %q: want the ReadWriteMany volume published to node-2", f.csiCalls())
	}
}

// The same scenario one step earlier: the VolumeAttachment on node-2 is
// created while node-1's ControllerPublish is still in flight, its object
// already force-deleted, so no orphan exists yet. The publish in flight
// holds node-2's back just the same; once it returned, it is an orphan
// that keeps doing so.
func TestPublishInFlightOfSingleNodeVolumeBlocksAnotherNode(t *testing.T) {
	for i := range 5 {
		f := newExecFixture(t, execPV("pv-a"), execVA("va-1", "pv-a"), execCSINode(), csiNodeOf("node-2", "node-2-id"))
		withStore(f)
		if _, err := f.driver.AddFault(csimock.Rule{Method: "ControllerPublishVolume", NodeID: "node-1-id", Phase: csimock.PhaseAfter, Latency: 300 * time.Millisecond, Once: true}); err != nil {
			t.Fatal(err)
		}
		if _, err := f.driver.AddFault(csimock.Rule{Method: "ControllerUnpublishVolume", Code: codes.Unavailable, Message: "backend unreachable"}); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = f.ctrl.syncAttach(f.ctx, "va-1")
		}()
		f.waitFor("node-1's publish in effect", func() bool { return slices.Contains(f.driver.Published("handle-pv-a"), "node-1-id") })
		if err := f.tracker.Delete(vaGVR, "", "va-1"); err != nil {
			t.Fatal(err)
		}
		va2 := execVA("va-2", "pv-a")
		va2.Spec.NodeName = "node-2"
		if err := f.tracker.Add(va2); err != nil {
			t.Fatal(err)
		}
		f.waitFor("va-2 in the cache", func() bool { va, _ := LookupVA(f.vaStore, "va-2"); return va != nil })
		_, err := f.ctrl.syncAttach(f.ctx, "va-2")
		<-done
		if err == nil || !strings.Contains(err.Error(), "in flight") {
			t.Errorf("iteration %d: va-2's pass during node-1's publish = %v, want it held back by the publish in flight", i, err)
		}
		if _, err := f.ctrl.syncAttach(f.ctx, "va-2"); err == nil || !strings.Contains(err.Error(), "deleted or replaced") {
			t.Errorf("iteration %d: va-2's pass after node-1's publish = %v, want it held back by the orphan", i, err)
		}
		for _, c := range f.csiCalls() {
			if strings.HasPrefix(c, "ControllerPublishVolume handle-pv-a node-2-id") {
				t.Fatalf("iteration %d: ControllerPublish to node-2 while node-1 has the volume: CSI calls %q", i, f.csiCalls())
			}
		}
	}
}

// The orphan that holds node-2's publish back could not be recorded (RBAC
// forbids the write): node-2's VolumeAttachment says that too, with the
// ConfigMap and the Role rule, as every VolumeAttachment that waits for
// an unrecorded orphan does.
func TestOrphanOnAnotherNodeThatCannotBeRecordedSaysWhy(t *testing.T) {
	f := newExecFixture(t, execPV("pv-a"), execVA("va-1", "pv-a"), execCSINode(), csiNodeOf("node-2", "node-2-id"))
	f.ctrl.cfg.OrphanNamespace = "latch-system"
	f.ctrl.exec.records = &unwritableStore{memOrphanStore: &memOrphanStore{recs: map[string]orphanRecord{}}, putErr: unwritableShapes[2].err}
	forceDeleteOnFirstStatusPatch(f, "va-1")
	if _, err := f.driver.AddFault(csimock.Rule{Method: "ControllerUnpublishVolume", Code: codes.Unavailable, Message: "backend unreachable"}); err != nil {
		t.Fatal(err)
	}
	_, _ = f.ctrl.syncAttach(f.ctx, "va-1")
	addVA2OnNode2(t, f)
	if _, err := f.ctrl.syncAttach(f.ctx, "va-2"); err == nil {
		t.Fatal("va-2 attached while the orphan on node-1 is published")
	}
	ae := f.va("va-2").Status.AttachError
	for _, want := range []string{"one node only", "tracked in memory only", "latch-system/" + OrphanRecordName(execDriver), unwritableShapes[2].want} {
		if ae == nil || !strings.Contains(ae.Message, want) {
			t.Errorf("va-2 attachError = %+v, want it to say %q", ae, want)
		}
	}
	if ae != nil && len(ae.Message) > maxVolumeErrorMessageBytes || ae != nil && strings.Contains(ae.Message, "truncated") {
		t.Errorf("va-2 attachError is cut: %q", ae.Message)
	}
}
