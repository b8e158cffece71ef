package attacher

import (
	"strings"
	"testing"
	"time"

	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/testutil"

	"github.com/latchcsi/latch/internal/csi"
	"github.com/latchcsi/latch/internal/csimock"
)

// A driver whose ListVolumes answers every page with a fresh next_token is
// paged only up to the page budget, and one that hands back a token it
// returned before only until then: the reconcile fails with an error
// naming the driver and the pages read, counts it in
// latch_attacher_listvolumes_aborted_total, and repairs nothing from the
// partial listing. Without the fault the same reconcile repairs the
// VolumeAttachment the driver does not list as published.
func TestListVolumesReconcileStopsAtThePageBudgetAndAtARepeatedToken(t *testing.T) {
	for _, tc := range []struct {
		fault  csimock.NextTokenFault
		calls  int
		reason string
		msg    string
	}{
		{csimock.NextTokenFresh, 5, csi.ListAbortedPageBudget, "given up after 5 pages, the page budget"},
		{csimock.NextTokenRepeat, 2, csi.ListAbortedRepeatedToken, "given up after 2 pages: the driver returned a next_token it had returned before"},
	} {
		t.Run(string(tc.fault), func(t *testing.T) {
			f := newExecFixture(t, execPV("pv-l"), attachedVA("va-l", "pv-l"), execCSINode())
			lister, err := csi.Connect(f.ctx, csi.Options{Address: f.driver.Endpoint(), ConnectTimeout: 10 * time.Second, ListVolumesMaxPages: 5})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { lister.Close() })
			f.ctrl.exec.csi = lister
			m := NewMetrics()
			m.Register(metrics.NewKubeRegistry().MustRegister)
			f.ctrl.exec.metrics = m
			id, err := f.driver.AddFault(csimock.Rule{Method: "ListVolumes", NextToken: tc.fault})
			if err != nil {
				t.Fatal(err)
			}

			err = f.ctrl.reconcileOnce(f.ctx)
			if err == nil || !strings.Contains(err.Error(), `driver "`+execDriver+`"`) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("reconcile error = %v, want one naming driver %q and %q", err, execDriver, tc.msg)
			}
			if got := len(f.driver.CallsTo("ListVolumes")); got != tc.calls {
				t.Errorf("ListVolumes calls = %d, want %d", got, tc.calls)
			}
			if got, err := testutil.GetCounterMetricValue(m.listAborted.WithLabelValues(tc.reason)); err != nil || got != 1 {
				t.Errorf("latch_attacher_listvolumes_aborted_total{reason=%q} = %v (%v), want 1", tc.reason, got, err)
			}
			f.requireWrites()

			f.driver.RemoveFault(id)
			if err := f.ctrl.reconcileOnce(f.ctx); err != nil {
				t.Fatalf("reconcile without the fault: %v", err)
			}
			f.requireWrites("patch volumeattachments/status va-l")
		})
	}
}
