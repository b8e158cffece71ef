package attacher_test

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/app"
	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/testsupport"
)

// gauge records what a replica reports as latch_attacher_competing_instances.
type gauge struct {
	mu       sync.Mutex
	now, max float64
	sets     int
}

func (g *gauge) Set(v float64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.now, g.max = v, max(g.max, v)
	g.sets++
}

func (g *gauge) get() (now, maxSeen float64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.now, g.max
}

// errorLog keeps every error line a replica logs, as "msg k=v k=v".
type errorLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *errorLog) find(parts ...string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.lines {
		if !slices.ContainsFunc(parts, func(p string) bool { return !strings.Contains(line, p) }) {
			return line
		}
	}
	return ""
}

type captureSink struct {
	logr.LogSink
	log *errorLog
	kv  []any
}

func (s captureSink) Error(err error, msg string, kv ...any) {
	s.log.mu.Lock()
	s.log.lines = append(s.log.lines, fmt.Sprintf("%s %v %v err=%v", msg, s.kv, kv, err))
	s.log.mu.Unlock()
	s.LogSink.Error(err, msg, kv...)
}

func (s captureSink) WithValues(kv ...any) logr.LogSink {
	return captureSink{s.LogSink.WithValues(kv...), s.log, append(append([]any{}, s.kv...), kv...)}
}

func (s captureSink) WithName(name string) logr.LogSink {
	return captureSink{s.LogSink.WithName(name), s.log, s.kv}
}

func capturingLogger(l *errorLog) *klog.Logger {
	logger := logr.New(captureSink{LogSink: klog.Background().GetSink(), log: l})
	return &logger
}

// gatheredCompeting reads latch_attacher_competing_instances from the legacy
// registry, which the binary's --http-endpoint serves.
func gatheredCompeting(t *testing.T) (float64, bool) {
	t.Helper()
	mfs, err := legacyregistry.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "latch_attacher_competing_instances" && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue(), true
		}
	}
	return 0, false
}

func (e *env) competingEvents() []string {
	e.t.Helper()
	events, err := e.client.CoreV1().Events("default").List(e.ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Lease,involvedObject.name=" + kube.LeaseName(e.name)})
	if err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for _, ev := range events.Items {
		if ev.Reason == app.EventReasonCompetingAttacher {
			out = append(out, ev.Type+" "+ev.Message)
		}
	}
	return out
}

// Two replicas without --leader-election (upstream's default): the second
// finds the first holding the driver's Lease, says so (error log naming
// both, Warning event on the Lease, latch_attacher_competing_instances 1) and
// does no work, so a slow ControllerPublish of one can never race the
// other. When the first stops, the second takes over.
func TestTwoAttachersWithoutLeaderElectionSecondReportsAndDoesNoWork(t *testing.T) {
	e := newEnv(t, envOptions{noAttacher: true})
	gA := &gauge{}
	e.stopAtt = e.startAttacher(envOptions{competing: gA}, "replica-a")
	pv0, va0 := e.prefix+"-pv0", e.prefix+"-va0"
	e.createPV(pv0)
	e.createVA(e.newVA(va0, pv0, e.node))
	e.waitAttached(va0, 30*time.Second)

	logsB := &errorLog{}
	writesB := testsupport.NewAPITransport()
	cfg := cluster.RESTConfig()
	cfg.WrapTransport = writesB.Wrap
	// B uses the process-wide gauge: the one --http-endpoint serves.
	stopB := e.startAttacherAs(cfg, envOptions{logger: capturingLogger(logsB)}, "replica-b", "default")
	t.Cleanup(stopB)

	e.eventually(10*time.Second, "replica-b reports replica-a", func() (bool, error) {
		v, ok := gatheredCompeting(t)
		return ok && v == 1 && len(e.competingEvents()) > 0 &&
			logsB.find("Another csi-attacher is active", "replica-b", "replica-a") != "", nil
	})
	evs := e.competingEvents()
	if len(evs) != 1 || !strings.HasPrefix(evs[0], "Warning ") || !strings.Contains(evs[0], "replica-b") || !strings.Contains(evs[0], "replica-a") {
		t.Errorf("CompetingAttacher events on the Lease = %q, want one Warning naming replica-b and replica-a", evs)
	}

	// The race the red team found: a slow publish while both replicas see
	// the VolumeAttachment. Only one may call the driver.
	for i := range 5 {
		pv, va := fmt.Sprintf("%s-pv%d", e.prefix, i+1), fmt.Sprintf("%s-va%d", e.prefix, i+1)
		e.createPV(pv)
		if _, err := e.driver.AddFault(csimock.Rule{Method: publishMethod, VolumeID: pv, Latency: 300 * time.Millisecond, Once: true}); err != nil {
			t.Fatal(err)
		}
		e.createVA(e.newVA(va, pv, e.node))
		e.waitAttached(va, 30*time.Second)
		time.Sleep(300 * time.Millisecond) // a second publish would be in flight by now
		if n := len(e.callsFor(publishMethod, pv)); n != 1 {
			t.Errorf("iteration %d: ControllerPublish of %s called %d times with two replicas, want 1", i, pv, n)
		}
	}
	if n := vaWriteCount(writesB); n != 0 {
		t.Errorf("replica-b wrote %d times to VolumeAttachments while replica-a held the Lease, want 0", n)
	}
	if _, maxA := gA.get(); maxA != 0 {
		t.Errorf("replica-a (the one working) reported competing instances %v, want 0", maxA)
	}
	if got := e.driver.Stats().Publish.DuplicatePublishes; got != 0 {
		t.Errorf("duplicate publishes = %d, want 0", got)
	}

	// replica-a stops and releases the Lease: replica-b works.
	e.stopAtt()
	pvN, vaN := e.prefix+"-pvn", e.prefix+"-van"
	e.createPV(pvN)
	e.createVA(e.newVA(vaN, pvN, e.node))
	e.waitAttached(vaN, 30*time.Second)
	if vaWriteCount(writesB) == 0 {
		t.Error("replica-b did not attach after replica-a stopped")
	}
	if v, _ := gatheredCompeting(t); v != 0 {
		t.Errorf("latch_attacher_competing_instances = %v after replica-a stopped, want 0", v)
	}
	l, err := e.client.CoordinationV1().Leases("default").Get(e.ctx, kube.LeaseName(e.name), metav1.GetOptions{})
	if err != nil || ptrString(l.Spec.HolderIdentity) != "replica-b" {
		t.Errorf("Lease holder = %v (%v), want replica-b", l, err)
	}
}

// With --leader-election on both replicas, the standby is the normal case:
// no competing-instance report of any kind.
func TestTwoAttachersWithLeaderElectionReportNoCompetingInstance(t *testing.T) {
	e := newEnv(t, envOptions{noAttacher: true})
	gA, gB := &gauge{}, &gauge{}
	logs := &errorLog{}
	e.stopAtt = e.startAttacher(envOptions{leader: true, competing: gA, logger: capturingLogger(logs)}, "leader-a")
	pv, _, _ := e.attachOne(30 * time.Second)
	stopB := e.startAttacher(envOptions{leader: true, competing: gB, logger: capturingLogger(logs)}, "standby-b")
	t.Cleanup(stopB)
	// Ten retry periods of the standby watching the leader renew.
	time.Sleep(2 * time.Second)
	for name, g := range map[string]*gauge{"leader-a": gA, "standby-b": gB} {
		if _, m := g.get(); m != 0 {
			t.Errorf("%s reported competing instances %v with leader election on, want 0", name, m)
		}
	}
	if evs := e.competingEvents(); len(evs) != 0 {
		t.Errorf("CompetingAttacher events with leader election on: %q", evs)
	}
	if line := logs.find("Another csi-attacher is active"); line != "" {
		t.Errorf("error log with leader election on: %s", line)
	}
	if n := e.driver.PublishCount(pv, e.nodeID); n != 1 {
		t.Errorf("ControllerPublish count = %d, want 1", n)
	}
}

// vaWriteCount counts the writes to VolumeAttachments (and their
// subresources) a transport saw.
func vaWriteCount(tr *testsupport.APITransport) int {
	n := 0
	for _, w := range tr.Writes() {
		if w.Resource == "volumeattachments" {
			n++
		}
	}
	return n
}
