package controller

import (
	"slices"
	"sync"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/util/workqueue"
)

// passCounter is a workqueue.MetricsProvider that records, in order, the
// name of the queue of every pass a worker starts (the queue's latency is
// observed when a worker takes an item), and marks recorded by the test.
type passCounter struct {
	mu     sync.Mutex
	passes []string
}

func (p *passCounter) record(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.passes = append(p.passes, s)
}

// since returns what was recorded from index from on.
func (p *passCounter) since(from int) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.passes[min(from, len(p.passes)):])
}

func (p *passCounter) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.passes)
}

type passStart struct {
	p     *passCounter
	queue string
}

func (s passStart) Observe(float64) { s.p.record(s.queue) }

type noMetric struct{}

func (noMetric) Inc()            {}
func (noMetric) Dec()            {}
func (noMetric) Set(float64)     {}
func (noMetric) Observe(float64) {}

func (p *passCounter) NewDepthMetric(string) workqueue.GaugeMetric { return noMetric{} }
func (p *passCounter) NewAddsMetric(string) workqueue.CounterMetric {
	return noMetric{}
}
func (p *passCounter) NewLatencyMetric(name string) workqueue.HistogramMetric {
	return passStart{p: p, queue: name}
}
func (p *passCounter) NewWorkDurationMetric(string) workqueue.HistogramMetric { return noMetric{} }
func (p *passCounter) NewUnfinishedWorkSecondsMetric(string) workqueue.SettableGaugeMetric {
	return noMetric{}
}
func (p *passCounter) NewLongestRunningProcessorSecondsMetric(string) workqueue.SettableGaugeMetric {
	return noMetric{}
}
func (p *passCounter) NewRetriesMetric(string) workqueue.CounterMetric { return noMetric{} }

var _ workqueue.MetricsProvider = (*passCounter)(nil)

// nodeStatusWritten marks in passes the node status patches that list a
// volume.
const nodeStatusWritten = "node status written"

// TestPodRoute_oneVolumeReachesNodeStatusInThreeQueuePasses follows one
// Pod with one volume from its informer event to its node's
// status.volumesAttached and counts the queue passes started on the way
// (the Pod queue, the key queue, the node status queue): at most three.
// csi-attacher (played by the test) attaches the VolumeAttachment as soon
// as it is created.
func TestPodRoute_oneVolumeReachesNodeStatusInThreeQueuePasses(t *testing.T) {
	pv, pvc := boundClaim("vol-1", v1.ReadWriteOnce)
	passes := &passCounter{}
	name := upstreamVAName("vol-1", testDriver, "node-a")
	w := newFakeWorldWith(t, Config{Workers: 2, QueueMetrics: passes}, func(w *fakeWorld) {
		w.client.PrependReactor("patch", "nodes", func(action clienttesting.Action) (bool, runtime.Object, error) {
			if p := action.(clienttesting.PatchActionImpl); p.GetSubresource() == "status" && len(p.GetPatch()) > 0 &&
				slices.Contains(p.GetPatch(), '[') {
				passes.record(nodeStatusWritten)
			}
			return false, nil, nil
		})
	}, managedNode("node-a"), pv, pvc)
	w.settle()
	from := passes.len()

	w.addPod(podUsing("app", "node-a", "vol-1"))
	w.waitWrites(1)
	w.attach(name)
	w.waitWrites(2)
	if got := w.nodePatches("node-a"); !slices.EqualFunc(got, [][]v1.UniqueVolumeName{{uniqueName("vol-1")}}, slices.Equal) {
		t.Fatalf("node status patches = %v, want one listing vol-1", got)
	}
	route := passes.since(from)
	written := slices.Index(route, nodeStatusWritten)
	if written < 0 {
		t.Fatalf("passes %q: no node status write recorded", route)
	}
	if before := route[:written]; len(before) > 3 {
		t.Errorf("the Pod reached node status after %d queue passes %q, want at most 3", len(before), before)
	} else {
		t.Logf("queue passes until node status: %q", before)
	}
}
