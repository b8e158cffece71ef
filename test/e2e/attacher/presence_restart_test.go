package attacher_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/attacher"
	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/testsupport"
)

// presenceProcess is one csi-attacher process without --leader-election
// in the Pod with UID podUID, run outside the stack so that its exit is
// the test's to judge.
type presenceProcess struct {
	stop func()
	done chan struct{} // closed when RunSidecar returned
}

func (e *env) startPresenceProcess(cfg *rest.Config, o envOptions, identity, podUID string) *presenceProcess {
	c := e.attacherConfig(cfg, o, identity, "default")
	c.Leader.Presence.PodUID = podUID
	logger := klog.Background().WithName(identity)
	if o.logger != nil {
		logger = *o.logger
	}
	ctx, stop := context.WithCancel(klog.NewContext(e.ctx, logger))
	p := &presenceProcess{stop: stop, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		if err := attacher.RunSidecar(ctx, c); err != nil {
			klog.FromContext(ctx).Info("Process ended", "err", err)
		}
	}()
	e.t.Cleanup(func() { p.stop(); <-p.done })
	return p
}

func (e *env) leaseHolder() string {
	e.t.Helper()
	l, err := e.client.CoordinationV1().Leases("default").Get(e.ctx, kube.LeaseName(e.name), metav1.GetOptions{})
	if err != nil {
		e.t.Fatalf("Lease: %v", err)
	}
	return ptrString(l.Spec.HolderIdentity)
}

// csi-attacher without --leader-election (upstream's default), its
// container crashes (killed: the Lease is not released) and restarts in
// the same Pod. The new process finds the Lease held, renewed a moment
// ago, by its own Pod's previous process: it takes it over at once and
// works, with no CompetingAttacher event, no error and no wait. Before,
// the holder identity was host name + start time only, so the new
// process counted its dead predecessor as a second replica: it waited a
// whole lease duration (15 s with the defaults), logged an error and
// recorded a CompetingAttacher event naming it. A process of another Pod
// (a genuine second replica) still waits and is reported. The crash and
// restart run several times, each against the Lease the previous process
// left renewed.
func TestPresenceRestartedContainerOfTheSamePodResumesAtOnce_anotherPodStillWaits(t *testing.T) {
	e := newEnv(t, envOptions{noAttacher: true})
	const podA, podB = "0c4f1d0e-pod-a", "7a2b9c41-pod-b"

	var prev string
	for i := range 4 {
		// Process i of Pod A, cut off from the API server and stopped
		// after it worked: as killed, its Lease is not released.
		identity := fmt.Sprintf("ctrl-a_%d", i)
		api := testsupport.NewAPITransport()
		api.SetPartitionTimeout(100 * time.Millisecond)
		cfg := cluster.RESTConfig()
		var cut atomic.Bool
		cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return watchCutter{api.Wrap(rt), &cut} }
		logs := &errorLog{}
		g := &gauge{}
		proc := e.startPresenceProcess(cfg, envOptions{competing: g, logger: capturingLogger(logs)}, identity, podA)

		pv, vaName := fmt.Sprintf("%s-pv%d", e.prefix, i), fmt.Sprintf("%s-va%d", e.prefix, i)
		e.createPV(pv)
		e.createVA(e.newVA(vaName, pv, e.node))
		e.waitAttached(vaName, 30*time.Second)
		holder := e.leaseHolder()
		if want := identity + "_pod-" + podA; holder != want {
			t.Fatalf("process %d: Lease holder = %q, want %q", i, holder, want)
		}
		if i > 0 {
			// It took over from its predecessor, which had left the
			// Lease held and renewed: it did not wait for it to
			// expire (the gauge would have been 1 while waiting) and
			// reported nothing.
			if _, m := g.get(); m != 0 {
				t.Errorf("process %d of the same Pod reported a competing instance (gauge max %v): it waited for its own predecessor %q", i, m, prev)
			}
			if evs := e.competingEvents(); len(evs) != 0 {
				t.Errorf("process %d of the same Pod: CompetingAttacher events %q, want none", i, evs)
			}
			logs.mu.Lock()
			if len(logs.lines) != 0 {
				t.Errorf("process %d of the same Pod logged errors: %q", i, logs.lines)
			}
			logs.mu.Unlock()
		}

		// Crash: cut off, then stopped; the release cannot reach the API
		// server.
		api.Partition()
		cut.Store(true)
		proc.stop()
		e.eventually(30*time.Second, fmt.Sprintf("process %d stops", i), func() (bool, error) {
			select {
			case <-proc.done:
				return true, nil
			default:
				return false, nil
			}
		})
		if h := e.leaseHolder(); h != holder {
			t.Fatalf("process %d: Lease holder = %q after the crash, want %q still (not released)", i, h, holder)
		}
		prev = holder
	}

	// The last process of Pod A, then a process of Pod B: a second
	// replica. B waits, is reported, and writes nothing.
	gA := &gauge{}
	e.startPresenceProcess(cluster.RESTConfig(), envOptions{competing: gA}, "ctrl-a_last", podA)
	e.eventually(10*time.Second, "the last process of Pod A holds the Lease", func() (bool, error) {
		return e.leaseHolder() == "ctrl-a_last_pod-"+podA, nil
	})
	logsB := &errorLog{}
	gB := &gauge{}
	writesB := testsupport.NewAPITransport()
	cfgB := cluster.RESTConfig()
	cfgB.WrapTransport = writesB.Wrap
	e.startPresenceProcess(cfgB, envOptions{competing: gB, logger: capturingLogger(logsB)}, "ctrl-b_0", podB)
	e.eventually(10*time.Second, "Pod B's process reports Pod A's", func() (bool, error) {
		v, _ := gB.get()
		return v == 1 && len(e.competingEvents()) > 0 && logsB.find("Another csi-attacher is active", "ctrl-b_0", "ctrl-a_last") != "", nil
	})
	evs := e.competingEvents()
	if len(evs) != 1 || !strings.HasPrefix(evs[0], "Warning ") || !strings.Contains(evs[0], "ctrl-b_0_pod-"+podB) || !strings.Contains(evs[0], "ctrl-a_last_pod-"+podA) {
		t.Errorf("CompetingAttacher events = %q, want one Warning naming Pod B's and Pod A's processes", evs)
	}
	pv, vaName := e.prefix+"-pvb", e.prefix+"-vab"
	e.createPV(pv)
	e.createVA(e.newVA(vaName, pv, e.node))
	e.waitAttached(vaName, 30*time.Second)
	if h := e.leaseHolder(); h != "ctrl-a_last_pod-"+podA {
		t.Errorf("Lease holder = %q while Pod A's process works, want it", h)
	}
	if n := vaWriteCount(writesB); n != 0 {
		t.Errorf("Pod B's process wrote %d times to VolumeAttachments while Pod A's held the Lease, want 0", n)
	}
	if _, m := gA.get(); m != 0 {
		t.Errorf("Pod A's working process reported a competing instance (gauge max %v), want 0", m)
	}
}
