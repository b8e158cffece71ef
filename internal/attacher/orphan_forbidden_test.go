package attacher

import (
	"errors"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/testutil"

	"github.com/latchcsi/latch/internal/csi"
)

// csi-attacher runs with a driver's usual Lease-only Role: the API server
// forbids reading the orphan record. Attaches are not held back: the
// VolumeAttachment is attached, with orphans tracked in memory only, and
// the Lease gets a Warning OrphanRecordFailed event naming the ConfigMap
// and the exact Role rule to add; the errors are counted and
// latch_attacher_orphan_record_unavailable is 1. The read is retried in
// the background: once RBAC allows it, the record's entry is settled and
// the gauge is 0 again.
func TestOrphanRecordForbiddenAttachesAnywayAndSaysWhy(t *testing.T) {
	f := newExecFixture(t, execPV("pv-a"), execVA("va-a", "pv-a"), execCSINode())
	f.ctrl.cfg.OrphanNamespace = "latch-system"
	f.ctrl.cfg.RetryIntervalStart, f.ctrl.cfg.RetryIntervalMax = 5*time.Millisecond, 20*time.Millisecond
	f.recorder.IncludeObject = true
	m := NewMetrics()
	m.Register(metrics.NewKubeRegistry().MustRegister)
	f.ctrl.exec.metrics = m
	capability, err := csi.VolumeCapability(csi.CapabilityInput{AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}, FSType: "ext4"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.driver.SeedPublication("handle-old", "node-1-id", false, capability); err != nil {
		t.Fatal(err)
	}
	mem := &memOrphanStore{recs: map[string]orphanRecord{
		"va-old": {VolumeAttachment: "va-old", UID: "u-old", VolumeHandle: "handle-old", NodeID: "node-1-id", NodeName: "node-1"},
	}}
	forbidden := apierrors.NewForbidden(v1.Resource("configmaps"), OrphanRecordName(execDriver),
		errors.New(`User "system:serviceaccount:latch-system:csi-attacher" cannot get resource "configmaps" in API group "" in the namespace "latch-system"`))
	store := &failingLoadStore{memOrphanStore: mem, err: forbidden, failures: 1 << 30}
	f.ctrl.exec.records = store

	defer f.run()()
	f.waitFor("va-a attached although the record cannot be read", func() bool { return f.va("va-a").Status.Attached })
	f.waitFor("the read retried", func() bool { return store.loadCount() > 2 })
	var leaseEvent string
	for _, e := range drainEvents(f.recorder) {
		if strings.Contains(e, "kind=Lease") && strings.Contains(e, "Warning "+EventOrphanRecordFailed) {
			leaseEvent = e
		}
	}
	for _, want := range []string{"latch-system/" + OrphanRecordName(execDriver), "RBAC forbids it", "in memory only",
		`resourceNames: ["` + OrphanRecordName(execDriver) + `"], verbs: ["get", "list", "watch", "update"]`, `verbs: ["create"]`, `namespace "latch-system"`} {
		if !strings.Contains(leaseEvent, want) {
			t.Errorf("Warning %s event on the Lease %q does not say %q", EventOrphanRecordFailed, leaseEvent, want)
		}
	}
	if got, _ := testutil.GetGaugeMetricValue(m.orphanRecordUnavailable); got != 1 {
		t.Errorf("latch_attacher_orphan_record_unavailable = %v, want 1", got)
	}
	if got, _ := testutil.GetCounterMetricValue(m.orphanRecordErrors.WithLabelValues("load")); got < 2 {
		t.Errorf("latch_attacher_orphan_record_errors_total{operation=load} = %v, want every refused read counted", got)
	}
	if got := f.driver.Published("handle-old"); len(got) != 1 {
		t.Fatalf("handle-old published to %v before the record could be read, want still published", got)
	}

	// RBAC is fixed: the next retry reads the record and settles its entry.
	store.lmu.Lock()
	store.failures = 0
	store.lmu.Unlock()
	f.waitFor("the recorded orphan unpublished once the record could be read", func() bool { return len(f.driver.Published("handle-old")) == 0 })
	f.waitFor("the gauge back to 0", func() bool { got, _ := testutil.GetGaugeMetricValue(m.orphanRecordUnavailable); return got == 0 })
	f.waitFor("a Normal event on the Lease saying the record is available again", func() bool {
		for _, e := range drainEvents(f.recorder) {
			if strings.Contains(e, "kind=Lease") && strings.HasPrefix(e, "Normal "+EventOrphanRecordAvailable) {
				return true
			}
		}
		return false
	})
}
