package attachdetach_test

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	v1 "k8s.io/api/core/v1"

	"github.com/latchcsi/latch/internal/attachdetach/controller"
	"github.com/latchcsi/latch/internal/csimock"
)

// The driver refuses ControllerPublishVolume with a final error: the real
// csi-attacher records it in the VolumeAttachment's status.attachError,
// the controller turns that into a Warning FailedAttachVolume event on the
// Pod carrying the driver's message, and the volume stays out of the node
// status. Once the fault is gone the attacher's retry succeeds and the
// Pod gets SuccessfulAttachVolume and runs.
func TestAttachError_driverRefusesPublish_warningOnPodThenAttachesOnceFixed(t *testing.T) {
	e := newRealKubeletEnv(t, controller.Config{Workers: 4})
	drv := e.stack.Driver
	node := e.addNode("n1")
	pv := e.volume("refused", rwo())
	driverMsg := "volume " + pv + " uses a disk layout this zone cannot attach"
	fault, err := drv.AddFault(csimock.Rule{Method: "ControllerPublishVolume", VolumeID: pv, Code: codes.InvalidArgument, Message: driverMsg})
	if err != nil {
		t.Fatal(err)
	}
	e.pod("app", node, pv)

	prefix := fmt.Sprintf("AttachVolume.Attach failed for volume %q : ", pv)
	var warning v1.Event
	e.eventually("FailedAttachVolume carrying the driver's error", func() (bool, error) {
		for _, ev := range e.events("app", "FailedAttachVolume") {
			if strings.HasPrefix(ev.Message, prefix) && strings.Contains(ev.Message, driverMsg) {
				warning = ev
				return true, nil
			}
		}
		return false, nil
	})
	if warning.Type != v1.EventTypeWarning || warning.Source.Component != controller.EventComponent ||
		warning.InvolvedObject.Kind != "Pod" || warning.InvolvedObject.Name != "app" {
		t.Errorf("event = type %q source %q object %+v, want a Warning from %s on Pod app", warning.Type, warning.Source.Component, warning.InvolvedObject, controller.EventComponent)
	}
	// The message is the VolumeAttachment's attachError, as upstream.
	va, ok := e.getVA(e.vaName(pv, node))
	if !ok || va.Status.Attached || va.Status.AttachError == nil {
		t.Fatalf("VolumeAttachment = %+v, want one with an attachError", va)
	}
	if !strings.Contains(va.Status.AttachError.Message, driverMsg) || !strings.Contains(va.Status.AttachError.Message, codes.InvalidArgument.String()) {
		t.Errorf("attachError = %q, want the driver's code and message", va.Status.AttachError.Message)
	}
	if got := attachedNames(e.node(node)); len(got) != 0 {
		t.Errorf("volumesAttached = %v while the attach fails", got)
	}
	if got := e.events("app", "SuccessfulAttachVolume"); len(got) != 0 {
		t.Errorf("SuccessfulAttachVolume while the attach fails: %+v", got)
	}
	if p := drv.PublishCount(pv, e.nodeID(node)); p != 0 {
		t.Errorf("driver published the volume %d times while refusing", p)
	}

	if !drv.RemoveFault(fault) {
		t.Fatal("fault rule not found")
	}
	e.waitAttachedVA(pv, node)
	e.waitNodeAttached(node, e.unique(pv))
	e.waitEvent("app", "SuccessfulAttachVolume", fmt.Sprintf("AttachVolume.Attach succeeded for volume %q ", pv))
	e.waitPodRunning("app")
	if p := drv.PublishCount(pv, e.nodeID(node)); p != 1 {
		t.Errorf("successful publishes = %d, want 1", p)
	}
	if va, _ := e.getVA(e.vaName(pv, node)); va.Status.AttachError != nil {
		t.Errorf("attachError not cleared after the attach: %+v", va.Status.AttachError)
	}

	// Detach goes through the driver too; nothing is left behind.
	e.deletePod("app")
	e.waitVAGone(pv, node)
	e.waitNodeAttached(node)
	e.eventually("volume unpublished", func() (bool, error) { return len(drv.Published(pv)) == 0, nil })
	if got := e.createCount(); got != 1 {
		t.Errorf("VolumeAttachment creates = %d, want 1 (the error is the attacher's to retry)", got)
	}
}
