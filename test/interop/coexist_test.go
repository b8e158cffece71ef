package interop

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/latchcsi/latch/internal/attachdetach/controller"
	"github.com/latchcsi/latch/internal/testsupport"
)

// The coexistence guard (docs/attachdetach-controller.md, "Another
// attach/detach controller") against the real kube-controller-manager
// v1.37.2: its attach/detach controller beside latch's is reported (log
// line, Warning event, gauge) within a bounded time; after the documented
// swap (kcm restarted with -attachdetach, then latch started) the objects
// kcm wrote before are history and nothing is reported.

// coexistPeriod is latch's --coexistence-report-period in these tests.
const coexistPeriod = 8 * time.Second

// coexistWait bounds how long after the first attach both controllers
// handle the guard must have reported.
const coexistWait = 60 * time.Second

const coexistLogLine = "Another attach/detach controller is running in this cluster"

// lockedBuffer collects a process's output.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// lines returns the lines that contain every one of parts.
func (b *lockedBuffer) lines(parts ...string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for _, l := range strings.Split(b.buf.String(), "\n") {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(l, p)
		}
		if all {
			out = append(out, l)
		}
	}
	return out
}

// startLatchAD starts latch's attachdetach-controller binary with the
// coexistence period, its output also in the returned buffer.
func (w *world) startLatchAD(name string) (*peer, *lockedBuffer) {
	w.t.Helper()
	out := &lockedBuffer{}
	endpoint := testsupport.FreeAddr(w.t)
	args := []string{
		"--kubeconfig=" + w.kcfg, "--v=2", "--http-endpoint=" + endpoint, "--leader-elect=false",
		"--max-wait-for-unmount=" + maxWaitForUnmount.String(),
		"--coexistence-report-period=" + coexistPeriod.String(),
	}
	p := w.startLatch(name, "cmd/attachdetach-controller", endpoint, args, out)
	// /metrics is served before the caches sync: wait for the controller
	// to run, and one second more, so that what happens next is later
	// than the initial lists' watermark (managedFields times have
	// one-second resolution).
	w.eventually(name+" started", func(context.Context) (bool, error) {
		return len(out.lines("Attach/detach controller started")) == 1, nil
	})
	time.Sleep(1100 * time.Millisecond)
	return p, out
}

// otherControllerEvents are the OtherAttachDetachController events (on
// Nodes and VolumeAttachments, so in namespace default).
func (w *world) otherControllerEvents() []v1.Event {
	w.t.Helper()
	sel := fields.Set{"reason": controller.OtherControllerReason}.String()
	evs, err := w.s.Client.CoreV1().Events(metav1.NamespaceDefault).List(w.ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		w.t.Fatal(err)
	}
	return evs.Items
}

// competing scrapes latch_attachdetach_competing_controllers.
func competing(ctx context.Context, p *peer) (float64, error) {
	s, err := p.Scrape(ctx)
	if err != nil {
		return 0, err
	}
	v, ok := s.Value(controller.CompetingControllersMetric, nil)
	if !ok {
		return 0, fmt.Errorf("%s has no %s", p.name, controller.CompetingControllersMetric)
	}
	return v, nil
}

// TestCoexist_kcmAttachDetachBesideLatchIsReported runs kcm's attach/detach
// controller and latch's at once while Pods come and go: latch reports kcm
// (error line naming the manager and an object, a Warning event on that
// object, the gauge at 1) within coexistWait, at most once per period, and
// keeps working; once kcm is stopped the gauge falls back to 0 after the
// period and new Pods still attach.
func TestCoexist_kcmAttachDetachBesideLatchIsReported(t *testing.T) {
	t.Parallel() // a world of its own, mostly waiting (worldsAtOnce)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	w := newWorld(t, ctx, pair{kcmAD, latchAt})
	latch, out := w.startLatchAD("latch-ad-coexist")
	defer w.stop(latch)

	l := newWorkload(w, "coexist")
	start := time.Now()
	// Attaches and detaches while both run, until latch reports: neither
	// controller writes anything while nothing changes, and which of the
	// two creates a VolumeAttachment or changes a node's list first is a
	// race, so detection needs some churn.
	detected := func(ctx context.Context) (bool, error) {
		v, err := competing(ctx, latch)
		if err != nil {
			return false, err
		}
		return v == 1 && len(out.lines(coexistLogLine, `manager="kube-controller-manager"`)) > 0 && len(w.otherControllerEvents()) > 0, nil
	}
	w.eventually("latch reports kcm's attach/detach controller (log, event, gauge)", func(ctx context.Context) (bool, error) {
		if ok, err := detected(ctx); ok || err != nil || time.Since(start) > coexistWait {
			return ok, err
		}
		l.add(2)
		l.settled(l.remove(1), false)
		return detected(ctx)
	})
	t.Logf("reported %s after the first Pod", time.Since(start))
	for _, line := range out.lines(coexistLogLine) {
		t.Logf("report: %s", line)
		if !strings.HasPrefix(strings.TrimSpace(line), "E") || !strings.Contains(line, `kind="`) || !strings.Contains(line, `name="`) {
			t.Errorf("the report is not an error line naming the evidence: %s", line)
		}
	}
	for _, e := range w.otherControllerEvents() {
		kind := e.InvolvedObject.Kind
		t.Logf("event: %s %s on %s %s: %s", e.Type, e.Reason, kind, e.InvolvedObject.Name, e.Message)
		if e.Type != v1.EventTypeWarning || (kind != "Node" && kind != "VolumeAttachment") || e.InvolvedObject.Name == "" ||
			!strings.Contains(e.Message, `"kube-controller-manager"`) || !strings.Contains(e.Message, e.InvolvedObject.Name) {
			t.Errorf("event %s %s on %s %s: %q, want a Warning on the evidence naming kube-controller-manager", e.Type, e.Reason, kind, e.InvolvedObject.Name, e.Message)
		}
		if e.Source.Component != controller.EventComponent {
			t.Errorf("event source %q, want %q", e.Source.Component, controller.EventComponent)
		}
	}
	// latch kept working beside kcm: every wanted Pod runs attached.
	l.settled(nil, false)

	// Once per period: more churn within one period adds no line.
	reports := len(out.lines(coexistLogLine))
	firstReport := time.Now()
	l.settled(l.remove(2), false)
	if n := len(out.lines(coexistLogLine)); time.Since(firstReport) < coexistPeriod && n != reports {
		t.Errorf("%d report lines within one period, want %d", n, reports)
	}
	if elapsed := time.Since(start); len(out.lines(coexistLogLine)) > int(elapsed/coexistPeriod)+1 {
		t.Errorf("%d report lines in %s, more than one per %s", len(out.lines(coexistLogLine)), elapsed, coexistPeriod)
	}

	// kcm off: the gauge goes back to 0 after the period and stays there
	// while latch alone attaches and detaches.
	w.stop(w.ctrl)
	w.ctrl = nil
	l.add(2)
	l.settled(l.remove(2), false)
	w.eventually("the gauge back to 0 one period after kcm stopped", func(ctx context.Context) (bool, error) {
		v, err := competing(ctx, latch)
		return v == 0, err
	})
	lines, events := len(out.lines(coexistLogLine)), len(w.otherControllerEvents())
	l.add(2)
	l.settled(l.remove(2), false)
	if v, err := competing(ctx, latch); err != nil || v != 0 {
		t.Errorf("gauge %v (err %v) with latch alone", v, err)
	}
	if n, e := len(out.lines(coexistLogLine)), len(w.otherControllerEvents()); n != lines || e != events {
		t.Errorf("latch alone: report lines %d → %d, events %d → %d", lines, n, events, e)
	}
	l.drain()
}

// TestCoexist_afterTheSwapNothingIsReported follows the swap runbook
// (docs/migration.md): kcm's attach/detach controller attaches volumes, kcm
// is restarted with -attachdetach, latch starts. Every VolumeAttachment
// and node list kcm wrote still names it; latch logs that history once at
// start, and reports nothing while it attaches and detaches alone, well
// past the period.
func TestCoexist_afterTheSwapNothingIsReported(t *testing.T) {
	t.Parallel() // a world of its own, mostly waiting (worldsAtOnce)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	w := newWorld(t, ctx, pair{kcmAD, latchAt})
	l := newWorkload(w, "coexist-swap")
	l.add(4)
	l.settled(nil, true)

	w.stop(w.ctrl)
	w.ctrl = w.startController(kcmAD, controllerOptions{kcmControllers: []string{"pv-protection", "-attachdetach"}})
	latch, out := w.startLatchAD("latch-ad-swap")
	defer w.stop(latch)

	const history = "wrote attach/detach fields before this controller started"
	w.eventually("latch logs kcm's writes as history at start", func(context.Context) (bool, error) {
		return len(out.lines(history, `manager="kube-controller-manager"`)) == 1, nil
	})
	t.Logf("history: %s", out.lines(history)[0])
	// latch alone: detach two of kcm's VolumeAttachments (their nodes'
	// lists change), attach new ones, for longer than a period.
	deadline := time.Now().Add(coexistPeriod + 2*time.Second)
	l.settled(l.remove(2), false)
	l.add(2)
	l.settled(nil, true)
	for time.Now().Before(deadline) {
		time.Sleep(time.Second)
	}
	l.settled(l.remove(2), false)
	if v, err := competing(ctx, latch); err != nil || v != 0 {
		t.Errorf("gauge %v (err %v) after the swap, want 0", v, err)
	}
	if lines := out.lines(coexistLogLine); len(lines) > 0 {
		t.Errorf("latch reported another controller after the swap:\n%s", strings.Join(lines, "\n"))
	}
	for _, e := range w.otherControllerEvents() {
		t.Errorf("event after the swap on %s %s: %s", e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Message)
	}
	l.drain()
}
