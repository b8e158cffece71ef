package attachdetach_test

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	v1 "k8s.io/api/core/v1"

	"github.com/latchcsi/latch/internal/attachdetach/controller"
	"github.com/latchcsi/latch/internal/csimock"
)

// A ReadWriteOnce volume whose detach from node n1 keeps failing (the
// driver refuses ControllerUnpublishVolume for n1): a Pod on n2 that
// wants it waits, and says why where its user looks, as
// kube-controller-manager does (it keeps the volume attached to n1 until
// the detach succeeds): one Warning FailedAttachVolume with the
// Multi-Attach text, not repeated while the detach is retried. Once the
// driver lets the detach through, the volume attaches to n2.
func TestMultiAttach_podWaitingForAFailingDetachElsewhereGetsTheMultiAttachEventThenAttaches(t *testing.T) {
	e := newEnvWith(t, envOptions{cfg: controller.Config{Workers: 4}, mockDriver: true})
	drv := e.stack.Driver
	n1, n2 := e.addNode("n1"), e.addNode("n2")
	pv := e.volume("rwo", rwo())
	e.pod("first", n1, pv)
	e.waitAttachedVA(pv, n1)
	e.waitNodeAttached(n1, e.unique(pv))

	fault, err := drv.AddFault(csimock.Rule{Method: "ControllerUnpublishVolume", NodeID: e.nodeID(n1),
		Code: codes.Internal, Message: "backend refuses the detach"})
	if err != nil {
		t.Fatal(err)
	}
	e.deletePod("first")
	// The detach is under way and failing: the VolumeAttachment is being
	// deleted and carries csi-attacher's detachError.
	e.eventually("detachError on the VolumeAttachment of "+n1, func() (bool, error) {
		va, ok := e.getVA(e.vaName(pv, n1))
		return ok && va.DeletionTimestamp != nil && va.Status.DetachError != nil, nil
	})

	e.pod("second", n2, pv)
	msg := fmt.Sprintf("Multi-Attach error for volume %q Volume is already exclusively attached to one node and can't be attached to another", pv)
	e.waitEvent("second", "FailedAttachVolume", msg)

	// csi-attacher keeps retrying (each failure a new detachError, each a
	// VolumeAttachment update the controller sees): the event is not
	// repeated, and n2 gets no VolumeAttachment.
	failures := len(failedUnpublishes(drv, e.nodeID(n1)))
	e.eventually("three more failed detaches", func() (bool, error) {
		return len(failedUnpublishes(drv, e.nodeID(n1))) >= failures+3, nil
	})
	e.consistently("no VolumeAttachment on "+n2+" while the volume is attached to "+n1, 500*time.Millisecond, func() (bool, error) {
		_, ok := e.getVA(e.vaName(pv, n2))
		return !ok, nil
	})
	evs := e.events("second", "FailedAttachVolume")
	if len(evs) != 1 || evs[0].Message != msg || evs[0].Type != v1.EventTypeWarning || evs[0].Count > 1 {
		t.Errorf("FailedAttachVolume events on the waiting pod = %+v, want exactly one Multi-Attach warning", evs)
	}

	if got := multiAttachWaiting(t, e); got != 1 {
		t.Errorf("%s{driver=%q} while the Pod waits = %v, want 1", controller.MultiAttachWaitingMetric, e.driver, got)
	}

	if !drv.RemoveFault(fault) {
		t.Fatal("fault rule not found")
	}
	e.waitVAGone(pv, n1)
	e.waitAttachedVA(pv, n2)
	e.waitNodeAttached(n2, e.unique(pv))
	e.waitNodeAttached(n1)
	e.waitEvent("second", "SuccessfulAttachVolume", fmt.Sprintf("AttachVolume.Attach succeeded for volume %q ", pv))
	if got := drv.Published(pv); len(got) != 1 || got[0] != e.nodeID(n2) {
		t.Errorf("driver has %s published to %v, want only %s", pv, got, e.nodeID(n2))
	}
	if evs := e.events("second", "FailedAttachVolume"); len(evs) != 1 || evs[0].Count > 1 {
		t.Errorf("FailedAttachVolume events on the pod once attached = %+v, want the one Multi-Attach warning", evs)
	}
	if got := multiAttachWaiting(t, e); got != 0 {
		t.Errorf("%s{driver=%q} once attached = %v, want 0", controller.MultiAttachWaitingMetric, e.driver, got)
	}
}

// multiAttachWaiting reads the controller's Multi-Attach waiting gauge of
// the env's driver (0 when it has no sample).
func multiAttachWaiting(t *testing.T, e *env) float64 {
	t.Helper()
	families, err := e.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != controller.MultiAttachWaitingMetric {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "driver" && l.GetValue() == e.driver {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return 0
}

// failedUnpublishes returns the driver's failed ControllerUnpublishVolume
// calls for nodeID.
func failedUnpublishes(drv *csimock.Driver, nodeID string) []csimock.Call {
	var out []csimock.Call
	for _, c := range drv.CallsTo("ControllerUnpublishVolume") {
		if c.NodeID == nodeID && c.Done() && c.Code != codes.OK {
			out = append(out, c)
		}
	}
	return out
}
