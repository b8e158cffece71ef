package reliability_test

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/testsupport/kubeletorder"
)

// TestInvariant4_killedAttachersSlowPublishEndingLate_isARepeatAfterADisruption:
// csi-attacher is killed while its ControllerPublish is slow in the
// driver; the new instance publishes again, at once; the dead instance's
// call ends later, OK. Judged in completion order the late call comes
// second but started first: the kill between the two starts is what
// hid its outcome, and invariant 4 accepts the repeat. The soak run of
// the real-kubelet chaos test (seed 1795673853785423430) reported three
// such repeats as unexplained: the checker looked for a disruption
// between the later start and the earlier one, an empty window.
func TestInvariant4_killedAttachersSlowPublishEndingLate_isARepeatAfterADisruption(t *testing.T) {
	e := newEnv(t, options{})
	node := e.addNode("n1")
	pv := e.volume("slow")
	// Slower than the new instance takes to start, within the attacher's
	// CSI timeout (attacherConfig: 3 s): the dead instance's call
	// succeeds late.
	e.fault(csimock.Rule{Method: "ControllerPublishVolume", Times: 1, Latency: 2500 * time.Millisecond})
	e.pod("p", node, pv)
	e.eventually(30*time.Second, "ControllerPublish of "+pv+" in flight", func() bool { return e.inFlight("ControllerPublishVolume", pv) })
	e.killAttacher()
	e.waitAttached(pv, node)
	e.eventually(10*time.Second, "every ControllerPublish of "+pv+" ended", func() bool { return !e.inFlight("ControllerPublishVolume", pv) })
	var ok []uint64
	for _, c := range e.mock.CallsTo("ControllerPublishVolume") {
		if c.VolumeID == pv && c.Code == codes.OK {
			ok = append(ok, c.ID)
		}
	}
	if len(ok) != 2 {
		t.Fatalf("%d successful ControllerPublish calls of %s, want the dead instance's and the new one's:\n%s", len(ok), pv, kubeletorder.CallTable(e.mock.CallsTo("ControllerPublishVolume")))
	}
	e.checkHistory()
	if e.repeats["csi-attacher killed"] != 1 {
		t.Errorf("repeats accepted by disruption: %v, want csi-attacher killed=1", e.repeats)
	}
}
