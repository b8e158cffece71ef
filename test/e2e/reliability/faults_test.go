package reliability_test

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/latchcsi/latch/internal/csimock"
)

// transientCodes are the codes after which the outcome of a call is
// unknown or retrying may succeed.
var transientCodes = []codes.Code{codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Aborted}

func (e *env) fault(r csimock.Rule) {
	e.t.Helper()
	if _, err := e.mock.AddFault(r); err != nil {
		e.t.Fatal(err)
	}
}

// callsFor counts a method's calls for one volume by success.
func (e *env) callsFor(method, volume string) (ok, failed int) {
	for _, c := range e.mock.CallsTo(method) {
		if c.VolumeID != volume || !c.Done() {
			continue
		}
		if c.Code == codes.OK {
			ok++
		} else {
			failed++
		}
	}
	return ok, failed
}

func TestTransientDriverErrors_publishUnpublishAndListVolumesRetriedToTheEnd(t *testing.T) {
	e := newEnv(t, options{})
	node := e.addNode("n1")
	var pvs []string
	for i, code := range transientCodes {
		pv := e.volume(fmt.Sprintf("v%d", i))
		pvs = append(pvs, pv)
		e.fault(csimock.Rule{Method: "ControllerPublishVolume", VolumeID: pv, Times: 2, Code: code, Message: "transient " + code.String()})
		e.fault(csimock.Rule{Method: "ControllerUnpublishVolume", VolumeID: pv, Times: 2, Code: code, Message: "transient " + code.String()})
	}
	// A reply lost after the driver did the work, and a call that hangs
	// past the attacher's timeout: both leave the outcome unknown.
	lost := e.volume("lost")
	e.fault(csimock.Rule{Method: "ControllerPublishVolume", VolumeID: lost, Phase: csimock.PhaseAfter, Once: true, Code: codes.DeadlineExceeded})
	e.fault(csimock.Rule{Method: "ControllerUnpublishVolume", VolumeID: lost, Once: true, Hang: true})
	pvs = append(pvs, lost)
	for _, code := range transientCodes {
		e.fault(csimock.Rule{Method: "ListVolumes", Once: true, Code: code})
	}
	e.fault(csimock.Rule{Method: "ListVolumes", Once: true, Hang: true})

	for i, pv := range pvs {
		e.pod(fmt.Sprintf("p%d", i), node, pv)
	}
	for _, pv := range pvs {
		e.waitAttached(pv, node)
	}
	for i, pv := range pvs[:len(transientCodes)] {
		if ok, failed := e.callsFor("ControllerPublishVolume", pv); ok != 1 || failed != 2 {
			t.Errorf("%s: ControllerPublishVolume calls for %s: %d ok, %d failed; want 1 and 2", transientCodes[i], pv, ok, failed)
		}
	}
	// The lost reply is followed by one repeat that finds the volume
	// published: two successful publishes at the driver, one attach.
	if got := e.mock.PublishCount(lost, e.nodeID(node)); got != 2 {
		t.Errorf("successful publishes of %s after a lost reply = %d, want 2 (the original and one retry)", lost, got)
	}
	// The ListVolumes reconciler keeps running through its failures.
	e.eventually(30*time.Second, "a successful ListVolumes after the failing ones", func() bool {
		calls := e.mock.CallsTo("ListVolumes")
		return len(calls) > 5 && calls[len(calls)-1].Code == codes.OK
	})
	e.checkInvariants(30 * time.Second)

	for i := range pvs {
		e.deletePod(fmt.Sprintf("p%d", i))
	}
	for _, pv := range pvs {
		e.waitGone(pv, node)
	}
	for i, pv := range pvs[:len(transientCodes)] {
		if ok, failed := e.callsFor("ControllerUnpublishVolume", pv); ok != 1 || failed != 2 {
			t.Errorf("%s: ControllerUnpublishVolume calls for %s: %d ok, %d failed; want 1 and 2", transientCodes[i], pv, ok, failed)
		}
	}
	if ok, failed := e.callsFor("ControllerUnpublishVolume", lost); ok != 1 || failed != 1 {
		t.Errorf("ControllerUnpublishVolume calls for %s: %d ok, %d failed; want a timed-out call then a successful one", lost, ok, failed)
	}
	e.checkInvariants(30 * time.Second)
	e.teardownClean()
}
