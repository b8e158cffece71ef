package reliability_test

import (
	"fmt"
	"strings"
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

// callCodes lists the finished calls of method for volume with their
// codes and messages, for a failure message.
func (e *env) callCodes(method, volume string) string {
	var b strings.Builder
	for _, c := range e.mock.CallsTo(method) {
		if c.VolumeID == volume && c.Done() {
			fmt.Fprintf(&b, "  #%d %s %s\n", c.ID, c.Code, c.Message)
		}
	}
	return b.String()
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

// inFlight reports whether a call of method for volume is running in the
// driver now.
func (e *env) inFlight(method, volume string) bool {
	for _, c := range e.mock.CallsTo(method) {
		if c.VolumeID == volume && !c.Done() {
			return true
		}
	}
	return false
}

// crashDriver kills the driver process (socket gone) and brings it back
// after down.
func (e *env) crashDriver(keepState bool, down time.Duration) {
	e.t.Helper()
	defer e.disrupt("driver crashed")()
	if err := e.mock.Crash(keepState); err != nil {
		e.t.Fatal(err)
	}
	time.Sleep(down)
	if err := e.mock.Restart(); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) attacherRestarts() int {
	n := 0
	for _, r := range e.attachers {
		n += r.restarts()
	}
	return n
}

func TestDriverCrash_midPublishAndMidUnpublish_recoversWithoutLeaks(t *testing.T) {
	e := newEnv(t, options{})
	node := e.addNode("n1")
	// forgot: the crash loses the publication the running call made.
	// kept: the backend committed the publication, the reply never left.
	forgot, kept := e.volume("forgot"), e.volume("kept")
	e.fault(csimock.Rule{Method: "ControllerPublishVolume", VolumeID: forgot, Once: true, Hang: true})
	e.fault(csimock.Rule{Method: "ControllerPublishVolume", VolumeID: kept, Once: true, Phase: csimock.PhaseAfter, Latency: time.Minute})
	e.pod("p-forgot", node, forgot)
	e.pod("p-kept", node, kept)
	e.eventually(30*time.Second, "both publishes in flight", func() bool {
		return e.inFlight("ControllerPublishVolume", forgot) && e.inFlight("ControllerPublishVolume", kept)
	})
	if got := e.mock.Published(kept); len(got) != 1 {
		t.Fatalf("before the crash %s is published to %v, want the backend to have committed it", kept, got)
	}
	e.crashDriver(true, 500*time.Millisecond)
	if got := e.mock.Published(kept); len(got) != 1 {
		t.Errorf("after the crash %s is published to %v: a committed publication must survive", kept, got)
	}
	e.waitAttached(forgot, node)
	e.waitAttached(kept, node)
	if e.attacherRestarts() == 0 {
		t.Errorf("csi-attacher did not restart after losing the driver connection")
	}
	// One successful publish each, after the call the crash cut. A retry
	// may also reach the driver while it or csi-attacher is still coming
	// back (and fail, cut again): more failed calls are timing, not a
	// second publication.
	for _, pv := range []string{forgot, kept} {
		if ok, failed := e.callsFor("ControllerPublishVolume", pv); ok != 1 || failed < 1 {
			t.Errorf("ControllerPublishVolume calls for %s: %d ok, %d failed; want the call cut by the crash and exactly one successful retry:\n%s", pv, ok, failed, e.callCodes("ControllerPublishVolume", pv))
		}
	}
	e.checkInvariants(30 * time.Second)

	// Mid-unpublish: the crash cuts the call before it changed anything.
	e.fault(csimock.Rule{Method: "ControllerUnpublishVolume", VolumeID: forgot, Once: true, Hang: true})
	e.deletePod("p-forgot")
	e.eventually(30*time.Second, "unpublish in flight", func() bool { return e.inFlight("ControllerUnpublishVolume", forgot) })
	restarts := e.attacherRestarts()
	e.crashDriver(false, 500*time.Millisecond)
	e.waitGone(forgot, node)
	if got := e.mock.Published(forgot); len(got) != 0 {
		t.Errorf("%s still published to %v after its VolumeAttachment went", forgot, got)
	}
	if e.attacherRestarts() == restarts {
		t.Errorf("csi-attacher did not restart after the second crash")
	}
	e.checkInvariants(30 * time.Second)
	e.teardownClean()
}

func TestAPIServerRestart_duringBurstOfAttachesAndDetaches(t *testing.T) {
	e := newEnv(t, options{})
	nodes := []string{e.addNode("n1"), e.addNode("n2")}
	const n = 24
	pvs := e.volumes(n)
	// The first half is attached; then the second half is asked for and
	// the first half let go, and the API server restarts in the middle.
	for i := range n / 2 {
		e.pod(fmt.Sprintf("p%d", i), nodes[i%2], pvs[i])
	}
	for i := range n / 2 {
		e.waitAttached(pvs[i], nodes[i%2])
	}
	e.fault(csimock.Rule{Method: "*", Latency: 50 * time.Millisecond})
	for i := n / 2; i < n; i++ {
		e.pod(fmt.Sprintf("p%d", i), nodes[i%2], pvs[i])
	}
	for i := range n / 2 {
		e.deletePod(fmt.Sprintf("p%d", i))
	}
	endDisruption := e.disrupt("API server restarted")
	if err := cluster.RestartAPIServer(e.ctx); err != nil {
		t.Fatal(err)
	}
	endDisruption()
	for i := n / 2; i < n; i++ {
		e.waitAttached(pvs[i], nodes[i%2])
	}
	for i := range n / 2 {
		e.waitGone(pvs[i], nodes[i%2])
	}
	e.checkInvariants(time.Minute)
	e.teardownClean()
}

func TestControllerKilled_midAttachAndMidDetach_newInstanceFinishesTheWork(t *testing.T) {
	e := newEnv(t, options{})
	node, pvs := e.addNode("n1"), e.volumes(8)
	e.fault(csimock.Rule{Method: "ControllerPublishVolume", Latency: 300 * time.Millisecond})
	for i, pv := range pvs {
		e.pod(fmt.Sprintf("p%d", i), node, pv)
	}
	e.eventually(30*time.Second, "the first publish in flight", func() bool { return len(e.mock.CallsTo("ControllerPublishVolume")) > 0 })
	e.killController()
	for _, pv := range pvs {
		e.waitAttached(pv, node)
	}
	e.checkInvariants(30 * time.Second)

	e.fault(csimock.Rule{Method: "ControllerUnpublishVolume", Latency: 300 * time.Millisecond})
	for i := range pvs {
		e.deletePod(fmt.Sprintf("p%d", i))
	}
	e.eventually(30*time.Second, "the first unpublish in flight", func() bool { return len(e.mock.CallsTo("ControllerUnpublishVolume")) > 0 })
	e.killController()
	for _, pv := range pvs {
		e.waitGone(pv, node)
	}
	e.checkInvariants(30 * time.Second)
	e.teardownClean()
}
