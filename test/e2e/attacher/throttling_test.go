package attacher_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/latchcsi/latch/internal/attacher"
	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// A backend whose API takes 20 calls a second (a token bucket five deep)
// while csi-attacher may run ten calls at once. With either driver
// concurrency every volume is attached once and detached, and nothing is
// left in attachError or detachError; the adaptive limit backs off on the
// throttled answers (ResourceExhausted, "Request limit exceeded"), so the
// backend refuses clearly fewer calls than with the fixed limit of ten.
func TestThrottlingBackendAttachesEveryVolumeOnceAndAdaptiveConcurrencyIsThrottledLess(t *testing.T) {
	throttled := map[string]int64{}
	for _, mode := range []string{attacher.ConcurrencyFixed, attacher.ConcurrencyAdaptive} {
		t.Run(mode, func(t *testing.T) {
			throttled[mode] = attachAndDetachBehindAThrottlingBackend(t, mode)
		})
	}
	if fixed, adaptive := throttled[attacher.ConcurrencyFixed], throttled[attacher.ConcurrencyAdaptive]; adaptive*4 > fixed*3 {
		t.Errorf("throttled calls: %d adaptive, %d fixed; want adaptive at most three quarters of fixed", adaptive, fixed)
	}
}

// attachAndDetachBehindAThrottlingBackend runs 40 volumes through attach
// and detach and returns how many attach calls the backend throttled.
func attachAndDetachBehindAThrottlingBackend(t *testing.T, mode string) int64 {
	const volumes = 40
	e := newEnv(t, envOptions{driverConcurrency: mode})
	if err := e.driver.SetBackend(&csimock.Backend{Latency: csimock.Duration(50 * time.Millisecond), Capacity: 100,
		Rate: 20, Burst: 5, ThrottleCode: csimock.Code(codes.ResourceExhausted)}); err != nil {
		t.Fatal(err)
	}
	// The publishes hang until every VolumeAttachment waits for one, so
	// that the burst reaches the backend at once however fast the API
	// server takes the creates.
	hang, err := e.driver.AddFault(csimock.Rule{Method: "ControllerPublishVolume", Hang: true})
	if err != nil {
		t.Fatal(err)
	}
	name := func(i int) string { return fmt.Sprintf("%s-%02d", e.prefix, i) }
	for i := range volumes {
		e.createPV(name(i))
		e.createVA(e.newVA(name(i), name(i), e.node))
	}
	e.eventually(time.Minute, "every VolumeAttachment prepared for its publish", func() (bool, error) {
		for i := range volumes {
			va := e.getVA(name(i))
			if va == nil || !slices.Contains(va.Finalizers, kubenames.AttacherFinalizer(e.name)) {
				return false, nil
			}
		}
		return true, nil
	})
	if !e.driver.ReleaseHang(hang) {
		t.Fatal("hang rule not found")
	}
	for i := range volumes {
		e.waitAttachedClean(name(i))
	}
	st := e.driver.Stats()
	if st.Backend == nil || st.Backend.Throttled == 0 {
		t.Fatalf("backend stats = %+v: the backend never throttled, the test proves nothing", st.Backend)
	}
	for i := range volumes {
		if n := e.driver.PublishCount(name(i), e.nodeID); n != 1 {
			t.Errorf("%s published %d times, want once", name(i), n)
		}
	}
	t.Logf("%s: attach calls served %d, throttled %d", mode, st.Backend.Served, st.Backend.Throttled)

	for i := range volumes {
		e.deleteVA(name(i))
	}
	for i := range volumes {
		e.waitGone(name(i))
		if pubs := e.driver.Published(name(i)); len(pubs) != 0 {
			t.Errorf("%s still published to %v", name(i), pubs)
		}
	}
	return st.Backend.Throttled
}
