package attacher_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/latchcsi/latch/internal/attacher"
)

// The scenario, against the real API server: a ReadWriteOnce
// volume's VolumeAttachment on node 1 is force-deleted (finalizers
// stripped) while its ControllerPublish is in flight, and every unpublish
// from node 1 fails. The Pod moves to node 2: a VolumeAttachment of another
// name asks for the volume there. The driver, which here would accept the
// second publish (SkipSingleNodeCheck, as a backend without that check),
// never has the volume on both nodes: the new VolumeAttachment waits with
// an attachError and a Warning event naming the orphan (volume, node 1,
// its node ID, the gone VolumeAttachment), and is attached once node 1's
// unpublish went through.
func TestOrphanOfSingleNodeVolumeBlocksAnotherNodeUntilUnpublished(t *testing.T) {
	e := newEnv(t, envOptions{skipSingleNodeCheck: true})
	node2, node2ID := e.prefix+"-n2", e.prefix+"-n2-id"
	e.createCSINode(node2, node2ID)
	pv, vaOld, vaNew := e.prefix+"-pv", e.prefix+"-va1", e.prefix+"-va2"
	e.createPV(pv)
	old, unpublishFault := e.orphanWithFailingUnpublish(pv, vaOld)

	e.createVA(e.newVA(vaNew, pv, node2))
	va := e.waitAttachError(vaNew, "one node only")
	for _, want := range []string{pv, fmt.Sprintf("%q", e.node), e.nodeID, fmt.Sprintf("%q", vaOld), string(old.UID)} {
		if !strings.Contains(va.Status.AttachError.Message, want) {
			t.Errorf("attachError %q of %s does not name %s", va.Status.AttachError.Message, vaNew, want)
		}
	}
	if msg := e.eventMessage(vaNew, attacher.EventAttachFailed); !strings.Contains(msg, vaOld) || !strings.Contains(msg, e.nodeID) {
		t.Errorf("%s event %q on %s does not name the orphan", attacher.EventAttachFailed, msg, vaNew)
	}
	// It stays so while node 1's unpublish keeps failing (retried).
	e.eventually(30*time.Second, "node 1's unpublish retried", func() (bool, error) {
		return len(e.callsFor("ControllerUnpublishVolume", pv)) >= 3, nil
	})
	if calls := e.callsFor("ControllerPublishVolume", pv); len(calls) != 1 {
		t.Fatalf("ControllerPublish calls of %s = %+v, want only node 1's while its orphan is published", pv, calls)
	}

	e.driver.RemoveFault(unpublishFault)
	e.waitAttached(vaNew, 30*time.Second)
	calls := e.driver.Calls()
	unpublished := callIndex(calls, "ControllerUnpublishVolume", pv, e.nodeID, codes.OK)
	published := callIndex(calls, "ControllerPublishVolume", pv, node2ID, codes.OK)
	if unpublished < 0 || published < unpublished {
		t.Errorf("node 1's unpublish at call %d, node 2's publish at call %d: want the unpublish first", unpublished, published)
	}
	if p := e.driver.Stats().Publish; p.SingleNodeViolationsTotal != 0 || p.MaxSingleNodePublishedNodes > 1 {
		t.Errorf("the driver had a single-node volume on two nodes: %+v", p.SingleNodeViolations)
	}
}
