package attacher_test

import (
	"fmt"
	"testing"
	"time"
)

// A csi-attacher without --leader-election (presence mode) whose API
// client is throttled by its own rate limiter (--kube-api-qps) while a
// burst of VolumeAttachments is attached keeps its Lease: the renewals go
// through a client of their own (app.LeaseClient). When they shared the
// work client's limiter, each renewal queued behind the burst's writes for
// longer than the renew deadline, presence mode stopped the work ("Lease
// ... not renewed for 3s: the renewal in flight had not returned") and
// the remaining VolumeAttachments were never attached, although no other
// replica wanted the Lease.
func TestPresenceKeepsItsLeaseWhileTheWorkClientIsThrottled(t *testing.T) {
	e := newEnv(t, envOptions{noAttacher: true})
	cfg := cluster.RESTConfig()
	// 2 requests a second: the burst below needs about 20 s of writes,
	// far longer than the 3 s renew deadline (stack.QuickLease).
	cfg.QPS, cfg.Burst = 2, 2
	stop := e.startAttacherAs(cfg, envOptions{}, "throttled", "default")
	defer stop()

	const n = 12
	names := make([]string, n)
	for i := range n {
		names[i] = fmt.Sprintf("%s-%02d", e.prefix, i)
		e.createPV(names[i])
		e.createVA(e.newVA(names[i], names[i], e.node))
	}
	for _, name := range names {
		e.waitAttached(name, 2*time.Minute)
	}
	// stop reports an attacher that returned on its own (a lost Lease)
	// as a test error.
}
