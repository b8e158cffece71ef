package bench

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/latchcsi/latch/internal/csimock"
)

// reconcileLatency slows each ListVolumes page in reconcileOverlap, so
// that one whole reconcile outlasts both --timeout and --reconcile-sync.
const reconcileLatency = 200 * time.Millisecond

// reconcileOverlap starts csi-attacher again with a ListVolumes reconcile
// slower than its --timeout (each page takes reconcileLatency, --timeout
// is 3 pages, so that a page held up on a busy machine still fits, while a
// whole reconcile of 20 pages or more does not) and its period (--reconcile-sync of half a page): a whole
// reconcile must still finish (it has its own --reconcile-timeout), runs
// must never overlap (at most one ListVolumes call in flight), and nothing
// is published or unpublished. It waits for one whole reconcile and the
// first page of the next.
func (e *scaleEnv) reconcileOverlap(ctx context.Context) error {
	w := e.w
	pages := (w.volumes + 1 + e.sz.MaxEntries - 1) / e.sz.MaxEntries
	rule, err := w.driverMock.AddFault(csimock.Rule{Method: "ListVolumes", Latency: reconcileLatency})
	if err != nil {
		return err
	}
	defer w.driverMock.RemoveFault(rule)
	listBefore := len(w.driverMock.CallsTo("ListVolumes"))
	driverBefore := w.calls()
	maxBefore := w.driverMock.Stats().Methods["ListVolumes"].MaxInFlight
	timeout := reconcileLatency * 3
	p, err := e.startAttacherProc("csi-attacher-reconcile.log", nil,
		"--timeout="+timeout.String(), "--reconcile-sync="+(reconcileLatency/2).String(),
		fmt.Sprintf("--max-entries=%d", e.sz.MaxEntries))
	if err != nil {
		return err
	}
	defer p.stop()
	// One whole run and the first page of the next: a run that started
	// while the one before was still paging would have shown as a second
	// ListVolumes in flight during the first (the period is half a page),
	// and the next run's first page shows that runs go on after a long
	// one. (Two whole runs took 80 s more at the full size.)
	want := pages + 1
	err = p.waitUntil(ctx, e.sz.ActionTimeout+time.Duration(want)*reconcileLatency*2, fmt.Sprintf("%d ListVolumes pages", want), func(context.Context) bool {
		calls := w.driverMock.CallsTo("ListVolumes")[listBefore:]
		done := 0
		for _, c := range calls {
			if c.Done() && c.Code == codes.OK {
				done++
			}
		}
		return done >= want
	})
	if err != nil {
		return err
	}
	calls := w.driverMock.CallsTo("ListVolumes")[listBefore:]
	failed := 0
	for _, c := range calls {
		if c.Done() && c.Code != codes.OK {
			failed++
		}
	}
	maxInFlight := w.driverMock.Stats().Methods["ListVolumes"].MaxInFlight
	publishes, unpublishes := w.callsSince(driverBefore, "") // every volume has an ID: all count
	e.rep.Figures["listvolumes_slow_pages_failed"] = failed
	e.rep.Figures["listvolumes_max_in_flight"] = maxInFlight
	e.rep.check(fmt.Sprintf("csi-attacher: a reconcile of %d pages of %s each completes past --timeout=%s", pages, reconcileLatency, timeout),
		"0 failed pages", fmt.Sprint(failed), failed == 0)
	e.rep.check(fmt.Sprintf("csi-attacher: reconciles longer than --reconcile-sync=%s do not overlap", reconcileLatency/2),
		"at most 1 ListVolumes in flight", fmt.Sprint(maxInFlight), maxInFlight <= 1 && maxBefore <= 1)
	e.rep.check("csi-attacher: slow reconciles publish and unpublish nothing", "0 / 0", fmt.Sprintf("%d / %d", publishes, unpublishes), publishes == 0 && unpublishes == 0)
	return nil
}
