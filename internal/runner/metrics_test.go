package runner

import (
	"context"
	"strings"
	"testing"

	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/component-base/metrics/testutil"
)

func noop(context.Context, string) (Result, error) { return Result{}, nil }

const addsHelp = `# HELP workqueue_adds_total [BETA] Total number of adds handled by workqueue
# TYPE workqueue_adds_total counter
`

// Two binaries in one process (latch-local's attacher and controller, two
// attachers of a test) each register their own QueueMetrics with their
// own registry: nothing collides, and each registry shows its own queues
// only.
func TestQueueMetrics_twoInstancesInOneProcessEachReportToTheirOwnRegistry(t *testing.T) {
	regA, regB := metrics.NewKubeRegistry(), metrics.NewKubeRegistry()
	qmA, qmB := NewQueueMetrics(), NewQueueMetrics()
	qmA.Register(regA.MustRegister)
	qmB.Register(regB.MustRegister)

	a := New[string](ReconcilerFunc[string](noop), Options{Name: "queue-a", MetricsProvider: qmA})
	b := New[string](ReconcilerFunc[string](noop), Options{Name: "queue-b", MetricsProvider: qmB})
	a.Enqueue("k1")
	a.Enqueue("k2")
	b.Enqueue("k1")

	if err := testutil.GatherAndCompare(regA, strings.NewReader(addsHelp+`workqueue_adds_total{name="queue-a"} 2
`), "workqueue_adds_total"); err != nil {
		t.Errorf("registry A: %v", err)
	}
	if err := testutil.GatherAndCompare(regB, strings.NewReader(addsHelp+`workqueue_adds_total{name="queue-b"} 1
`), "workqueue_adds_total"); err != nil {
		t.Errorf("registry B: %v", err)
	}
}

// One QueueMetrics, registered once, serves every queue of a binary, each
// under its own name label.
func TestQueueMetrics_oneRegistrationServesEveryQueueOfABinary(t *testing.T) {
	reg := metrics.NewKubeRegistry()
	qm := NewQueueMetrics()
	qm.Register(reg.MustRegister)
	attach := New[string](ReconcilerFunc[string](noop), Options{Name: "va", MetricsProvider: qm})
	detach := New[string](ReconcilerFunc[string](noop), Options{Name: "va-detach", MetricsProvider: qm})
	attach.Enqueue("x")
	detach.Enqueue("x")
	detach.Enqueue("y")

	want := addsHelp + `workqueue_adds_total{name="va"} 1
workqueue_adds_total{name="va-detach"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "workqueue_adds_total"); err != nil {
		t.Fatal(err)
	}
	wantDepth := `# HELP workqueue_depth [BETA] Current depth of workqueue
# TYPE workqueue_depth gauge
workqueue_depth{name="va"} 1
workqueue_depth{name="va-detach"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(wantDepth), "workqueue_depth"); err != nil {
		t.Fatal(err)
	}
}

// The runner registers nothing in component-base's process-wide registry
// and installs no process-wide provider: a queue made without a provider,
// in a process where nothing installed one, reports nothing anywhere.
func TestRunnerWithoutProviderRegistersNothingGlobally(t *testing.T) {
	r := New[string](ReconcilerFunc[string](noop), Options{Name: "unreported"})
	r.Enqueue("k")
	families, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if strings.HasPrefix(f.GetName(), "workqueue_") {
			t.Errorf("the legacy registry holds %s: something in the runner's imports installed a process-wide workqueue provider", f.GetName())
		}
	}
}
