package attacher

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/clock"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/latchcsi/latch/internal/csi"
	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/runner"
	"github.com/latchcsi/latch/internal/testsupport/fakeclock"
)

// clockedCSI reports the fake clock's time of every ControllerPublish and
// ControllerUnpublish call.
type clockedCSI struct {
	CSIClient
	clock clock.Clock
	calls chan time.Time
}

func (c *clockedCSI) ControllerPublish(ctx context.Context, req csi.PublishRequest) (map[string]string, error) {
	c.calls <- c.clock.Now()
	return c.CSIClient.ControllerPublish(ctx, req)
}

func (c *clockedCSI) ControllerUnpublish(ctx context.Context, volumeID, nodeID string, secrets map[string]string) error {
	c.calls <- c.clock.Now()
	return c.CSIClient.ControllerUnpublish(ctx, volumeID, nodeID, secrets)
}

// A ControllerUnpublish (and a ControllerPublish) that keeps failing is
// retried after --retry-interval-start, then after twice that and so on,
// as upstream's external-attacher with the same flags (its VolumeAttachment
// queue's per-item exponential failure rate limiter: with the default 1s,
// the first two retries come 1 s and 3 s after the failure). The status
// write recording each failure comes back through the watch before its
// call returns (echoFirst): it is our own and must not start a pass at
// once. The queue runs on a fake clock, stepped only once the retry's
// timer is armed.
func TestFailingDetachAndAttachAreRetriedAtUpstreamsIntervals(t *testing.T) {
	for _, tc := range []struct {
		name, method string
		va           runtime.Object
		queue        func(*Controller) *runner.Runner[string]
	}{
		{"detach", "ControllerUnpublishVolume", deleting(attachedVA("va-f", "pv-f")), func(c *Controller) *runner.Runner[string] { return c.detach }},
		{"attach", "ControllerPublishVolume", execVA("va-f", "pv-f"), func(c *Controller) *runner.Runner[string] { return c.attach }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			fc := testingclock.NewFakeClock(t0)
			ef := newEchoFirst()
			f := newExecFixtureWith(t, fixtureHooks{
				config: func(c *Config) { c.Clock, c.RetryIntervalStart, c.RetryIntervalMax = fc, time.Second, 5*time.Minute },
				setup:  ef.setup,
			}, execPV("pv-f"), tc.va, execCSINode())
			if _, err := f.driver.AddFault(csimock.Rule{Method: tc.method, Code: codes.Internal, Message: "array offline"}); err != nil {
				t.Fatal(err)
			}
			ef.install(t, f)
			calls := make(chan time.Time, 16)
			f.ctrl.exec.csi = &clockedCSI{CSIClient: f.ctrl.exec.csi, clock: fc, calls: calls}

			idle := fakeclock.SettledWaiters(fc)
			_, ctx := ktesting.NewTestContext(t)
			ctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			// The informer's add of va-f queued it: the first pass runs at once.
			go func() { done <- tc.queue(f.ctrl).Run(ctx) }()
			t.Cleanup(func() { cancel(); <-done })

			expectCall := func(at time.Time) {
				t.Helper()
				select {
				case got := <-calls:
					if !got.Equal(at) {
						t.Fatalf("%s at +%v, want +%v", tc.method, got.Sub(t0), at.Sub(t0))
					}
				case <-time.After(10 * time.Second):
					t.Fatalf("no %s at +%v", tc.method, at.Sub(t0))
				}
			}
			expectCall(t0)
			at := t0
			for _, d := range []time.Duration{1, 2, 4} {
				at = at.Add(d * time.Second)
				fakeclock.WaitArmed(t, fc, idle)
				fc.SetTime(at.Add(-time.Nanosecond))
				select {
				case got := <-calls:
					t.Fatalf("%s at +%v, before the retry due at +%v", tc.method, got.Sub(t0), at.Sub(t0))
				case <-time.After(50 * time.Millisecond):
				}
				fc.SetTime(at)
				expectCall(at)
			}
			for _, e := range ef.recorded() {
				if !e.own {
					t.Errorf("echo of our write at resourceVersion %s not recognised", e.rv)
				}
			}
		})
	}
}
