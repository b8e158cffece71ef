package attachdetach_test

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/latchcsi/latch/internal/attachdetach/controller"
	"github.com/latchcsi/latch/internal/attachdetach/decide"
	"github.com/latchcsi/latch/internal/attachdetach/state"
	"github.com/latchcsi/latch/internal/csimock"
)

// One Pod uses two PVs with the same CSI volume handle, one ReadWriteMany
// and one ReadWriteOnce. Whichever the Pod lists first, the volume is
// single-node: a second Pod on another node that uses only the RWX PV
// waits, with the Multi-Attach event, until the first Pod's node has
// detached it. (kube-controller-manager keeps the first spec it resolves,
// so there the outcome depends on the order of the Pod's volumes.)
func TestMultiAttach_onePodUsingRWXAndRWOPVsOfOneHandle_exclusiveInEitherOrder(t *testing.T) {
	e, drv := newRecordingEnv(t, controller.Config{}, nil)
	n1, n2 := e.addNode("n1"), e.addNode("n2")

	for _, tc := range []struct {
		name, handle string
		rwxFirst     bool
	}{
		{"RWX PV listed first", "rwx-listed-first", true},
		{"RWO PV listed first", "rwo-listed-first", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e.t = t
			handle := e.prefix + "-" + tc.handle
			rwx := e.aliasVolume(handle+"-rwx", handle, v1.ReadWriteMany)
			rwo := e.aliasVolume(handle+"-rwo", handle, v1.ReadWriteOnce)
			both, other := handle+"-both", handle+"-other"

			claims := []string{rwo, rwx}
			if tc.rwxFirst {
				claims = []string{rwx, rwo}
			}
			e.pod(both, n1, claims...)
			va := e.waitAttachedVA(handle, n1)
			e.waitPodRunning(both)
			// The VolumeAttachment names the single-node PV in both orders
			// when the controller resolves both claims in the Pod's first
			// pass. It names the RWX PV when the RWO claim reached the
			// controller's cache after the Pod did: the attachment is then
			// made exclusive once the claim resolves (decide:
			// TestScenarioRWOSpecResolvedAfterTheAttachMakesTheAttachmentExclusive;
			// controller: TestLateRWOClaimMakesTheAttachmentExclusive_podOnAnotherNodeWaitsForTheDetach),
			// which the hand-over below checks either way.
			if src := va.Spec.Source.PersistentVolumeName; src == nil || *src != rwo && *src != rwx {
				t.Errorf("VolumeAttachment on %s source = %+v, want PV %s (or %s)", n1, va.Spec.Source, rwo, rwx)
			} else if *src != rwo {
				t.Logf("VolumeAttachment on %s names %s: the RWO claim resolved after the attach started", n1, *src)
			}

			e.pod(other, n2, rwx)
			e.waitsThenTakesOver(drv, handle, other, n2, rwx, both, n1)
		})
	}
	e.t = t
}

// waitsThenTakesOver checks the story of Pod waiter, just created on
// node to with PV waiterPV, and Pod holder, which has handle attached on
// node from: waiter gets the Multi-Attach event naming holder, once, and
// nothing of handle reaches node to; once holder is deleted, handle is
// detached from from, attached to to (checkHandedOver) and waiter runs.
// Then waiter is deleted and handle detached.
func (e *env) waitsThenTakesOver(drv *csimock.Driver, handle, waiter, to, waiterPV, holder, from string) {
	e.t.Helper()
	e.waitEvent(waiter, decide.ReasonFailedAttachVolume, decide.MultiAttachMessage(waiterPV, state.PodRef{Namespace: e.ns, Name: waiter}, []state.PodRef{{Namespace: e.ns, Name: holder}}))
	e.consistently("no VolumeAttachment and no publish of "+handle+" on "+to, 2*time.Second, func() (bool, error) {
		_, exists := e.getVA(e.vaName(handle, to))
		return !exists && !publishedTo(drv, handle, to+"-id"), nil
	})
	if n := len(e.events(waiter, decide.ReasonFailedAttachVolume)); n != 1 {
		e.t.Errorf("%d FailedAttachVolume events on %s, want 1", n, waiter)
	}

	e.deletePod(holder)
	e.waitPodGone(holder)
	e.waitVAGone(handle, from)
	e.waitAttachedVA(handle, to)
	e.waitPodRunning(waiter)
	checkHandedOver(e.t, drv, handle, from+"-id", to+"-id")

	e.deletePod(waiter)
	e.waitPodGone(waiter)
	e.waitVAGone(handle, to)
}
