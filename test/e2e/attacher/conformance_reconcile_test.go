package attacher_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// foreignFinalizer is another controller's finalizer that keeps a deleting
// VolumeAttachment after ours is gone.
const foreignFinalizer = "conformance.latch.dev/keep"

var rwoMount = &csipb.VolumeCapability{
	AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{}},
	AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
}

// attachedWithForeignFinalizer creates a PV and a VA that carries
// foreignFinalizer, and waits for the attach.
func (e *env) attachedWithForeignFinalizer(pv, vaName string) {
	e.t.Helper()
	e.createPV(pv)
	va := e.newVA(vaName, pv, e.node)
	va.Finalizers = []string{foreignFinalizer}
	e.createVA(va)
	e.waitAttached(vaName, 30*time.Second)
}

// dropFinalizer removes finalizer from the VA with a guarded JSON patch
// (as an operator's kubectl edit would).
func (e *env) dropFinalizer(vaName, finalizer string) {
	e.t.Helper()
	va := e.getVA(vaName)
	i := slices.Index(va.Finalizers, finalizer)
	if i < 0 {
		e.t.Fatalf("VA %s has no finalizer %s: %v", vaName, finalizer, va.Finalizers)
	}
	patch := fmt.Sprintf(`[{"op":"test","path":"/metadata/finalizers/%d","value":%q},{"op":"remove","path":"/metadata/finalizers/%d"}]`, i, finalizer, i)
	if _, err := e.client.StorageV1().VolumeAttachments().Patch(e.ctx, vaName, types.JSONPatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		e.t.Fatalf("remove finalizer %s from VA %s: %v", finalizer, vaName, err)
	}
}

// waitUnpublishedByReconcile waits until the driver no longer lists pv on
// our node and ControllerUnpublish was called want times for it, then
// checks the VA: still kept by the foreign finalizer only, attached=false,
// no detachError; and no ControllerPublish beyond the first.
func (e *env) waitUnpublishedByReconcile(pv, vaName string, want int) {
	e.t.Helper()
	unpublishes := func() int {
		n := 0
		for _, c := range e.driver.CallsTo(unpublishMethod) {
			if c.VolumeID == pv && c.NodeID == e.nodeID {
				n++
			}
		}
		return n
	}
	e.eventually(30*time.Second, fmt.Sprintf("the reconcile unpublishes %s from %s", pv, e.nodeID), func() (bool, error) {
		return !slices.Contains(e.driver.Published(pv), e.nodeID) && unpublishes() >= want, nil
	})
	e.eventually(10*time.Second, fmt.Sprintf("VA %s marked detached", vaName), func() (bool, error) {
		va := e.getVA(vaName)
		return !va.Status.Attached && va.Status.DetachError == nil, nil
	})
	time.Sleep(time.Second) // several reconcile periods: a repeat would show
	if got := unpublishes(); got != want {
		e.t.Errorf("ControllerUnpublish calls for %s on %s = %d, want %d", pv, e.nodeID, got, want)
	}
	if got := len(e.driver.CallsTo("ControllerPublishVolume")); got != 1 {
		e.t.Errorf("ControllerPublish calls = %d, want 1 (the attach)", got)
	}
	va := e.getVA(vaName)
	if va.DeletionTimestamp == nil || !slices.Equal(va.Finalizers, []string{foreignFinalizer}) {
		e.t.Errorf("VA %s: deletionTimestamp=%v finalizers=%v, want deleting with only %s", vaName, va.DeletionTimestamp, va.Finalizers, foreignFinalizer)
	}
	e.dropFinalizer(vaName, foreignFinalizer)
	e.waitGone(vaName)
}

// upstream: TestCSIHandlerReconcileVA — a VolumeAttachment marked detached
// whose volume the driver still lists as published on its node is detached
// again. Here the VA is deleting and our finalizer is gone (our detach
// finished), another finalizer keeps the object, and the driver lists the
// volume as published on the node again: the ListVolumes reconcile
// unpublishes it.
func TestReconcileUnpublishesDeletingVAWithoutOurFinalizerStillListedPublished(t *testing.T) {
	e := newEnv(t, envOptions{reconcileSync: 200 * time.Millisecond})
	pv, vaName := e.prefix+"-pv", e.prefix+"-va"
	e.attachedWithForeignFinalizer(pv, vaName)
	e.deleteVA(vaName)
	e.eventually(30*time.Second, "our detach ends (finalizer removed, attached=false)", func() (bool, error) {
		va := e.getVA(vaName)
		return !slices.Contains(va.Finalizers, kubenames.AttacherFinalizer(e.name)) && !va.Status.Attached, nil
	})
	if got := e.driver.Published(pv); len(got) != 0 {
		t.Fatalf("after our detach the volume is published to %v", got)
	}
	// The driver reports the publication again (a lost unpublish, an
	// out-of-band publish): nothing but the reconcile can see it.
	if _, err := e.driver.SeedPublication(pv, e.nodeID, false, rwoMount); err != nil {
		t.Fatal(err)
	}
	e.waitUnpublishedByReconcile(pv, vaName, 2)
}

// Deliberate difference (docs/conformance.md): our finalizer was removed
// by hand from a VA whose detach kept failing; the VA is deleting, still
// marked attached, and another finalizer keeps it. Upstream compares only
// status.attached with the listing (both true: nothing to do) and leaves
// the volume published; latch unpublishes it and marks the VA detached.
func TestReconcileUnpublishesDeletingVAWhoseFinalizerWasRemovedByHand(t *testing.T) {
	e := newEnv(t, envOptions{reconcileSync: 200 * time.Millisecond})
	pv, vaName := e.prefix+"-pv", e.prefix+"-va"
	e.attachedWithForeignFinalizer(pv, vaName)
	rule, err := e.driver.AddFault(csimock.Rule{Method: unpublishMethod, VolumeID: pv, Code: codes.Internal, Message: "backend busy"})
	if err != nil {
		t.Fatal(err)
	}
	e.deleteVA(vaName)
	e.eventually(30*time.Second, "detachError from the failing unpublish", func() (bool, error) {
		return e.getVA(vaName).Status.DetachError != nil, nil
	})
	e.dropFinalizer(vaName, kubenames.AttacherFinalizer(e.name))
	if !slices.Contains(e.driver.Published(pv), e.nodeID) {
		t.Fatalf("volume not published to %s before the fault is removed", e.nodeID)
	}
	// The one unpublish that succeeds comes after the fault is removed
	// (the reconcile's, or the detach queue's: a deleting VA still marked
	// attached with latch's record is unpublished without our finalizer
	// too). The failed ones are counted once a call has succeeded: none
	// can fail after that.
	e.driver.RemoveFault(rule)
	e.eventually(30*time.Second, "an unpublish of "+pv+" that succeeds, and none in flight", func() (bool, error) {
		calls := e.driver.CallsTo(unpublishMethod)
		return slices.ContainsFunc(calls, func(c csimock.Call) bool { return c.VolumeID == pv && c.Done() && c.Code == codes.OK }) &&
			!slices.ContainsFunc(calls, func(c csimock.Call) bool { return c.VolumeID == pv && !c.Done() }), nil
	})
	failed := 0
	for _, c := range e.driver.CallsTo(unpublishMethod) {
		if c.VolumeID == pv && c.Done() && c.Code == codes.Internal {
			failed++
		}
	}
	if failed == 0 {
		t.Fatalf("no unpublish of %s failed against the fault", pv)
	}
	e.waitUnpublishedByReconcile(pv, vaName, failed+1)
}
