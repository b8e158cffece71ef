package attacher_test

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/latchcsi/latch/internal/csimock"
)

// A ControllerPublish that fails is retried after --retry-interval-start,
// not at once: the status.attachError write (and the finalizer write
// before the call) come back through the watch, often before their Patch
// calls return, and must be recognised as our own writes rather than
// start another pass (upstream external-attacher #337). Several volumes,
// each failing once, so that both orders of echo and answer occur. The
// check is a lower bound only: a slow machine makes the gap longer, never
// shorter.
func TestFailedPublishIsRetriedOnlyAfterTheRetryInterval(t *testing.T) {
	const retry = 2 * time.Second
	e := newEnv(t, envOptions{retryStart: retry})
	const n = 10
	for i := range n {
		pv := fmt.Sprintf("%s-pv%d", e.prefix, i)
		if _, err := e.driver.AddFault(csimock.Rule{Method: "ControllerPublishVolume", VolumeID: pv, Once: true, Code: codes.Internal, Message: "backend busy"}); err != nil {
			t.Fatal(err)
		}
		e.createPV(pv)
	}
	for i := range n {
		e.createVA(e.newVA(fmt.Sprintf("%s-va%d", e.prefix, i), fmt.Sprintf("%s-pv%d", e.prefix, i), e.node))
	}
	for i := range n {
		e.waitAttached(fmt.Sprintf("%s-va%d", e.prefix, i), 30*time.Second)
	}
	for i := range n {
		pv := fmt.Sprintf("%s-pv%d", e.prefix, i)
		calls := e.callsFor("ControllerPublishVolume", pv)
		if len(calls) != 2 || calls[0].Code != codes.Internal || calls[1].Code != codes.OK {
			t.Errorf("%s: ControllerPublish calls %+v, want one failure and one success", pv, calls)
			continue
		}
		if gap := calls[1].Start.Sub(calls[0].End); gap < retry {
			t.Errorf("%s: published again %v after the failure, before the retry interval %v", pv, gap, retry)
		}
	}
}
