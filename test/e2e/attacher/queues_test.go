package attacher_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/latchcsi/latch/internal/attacher"
	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// The queue tests run with --driver-concurrency=fixed: they prove the
// bound of --worker-threads and each direction's share, which need the
// limit to stay at the bound (the adaptive limit backs off from slow
// calls; TestThrottlingBackendAttachesEveryVolumeOnceAndAdaptiveConcurrencyIsThrottledLess
// and package adaptive's tests cover it).
func TestBurstOfSlowDetachesDoesNotStarveNewAttaches(t *testing.T) {
	const (
		detaching = 30 // three times the detach queue's CSI call slots
		attaching = 5
	)
	e := newEnv(t, envOptions{driverConcurrency: attacher.ConcurrencyFixed})
	name := func(kind string, i int) string { return fmt.Sprintf("%s-%s-%02d", e.prefix, kind, i) }
	for i := range detaching {
		e.createPV(name("old", i))
		e.createVA(e.newVA(name("old", i), name("old", i), e.node))
	}
	for i := range detaching {
		e.waitAttached(name("old", i), time.Minute)
	}

	// Every unpublish now takes 4 s: the detach workers are all busy and
	// most detaches wait in their queue. (Below the suite's 5 s --timeout:
	// a call the attacher gave up on could still be counted in flight by
	// the driver for a moment after its slot went to the next one.)
	if _, err := e.driver.AddFault(csimock.Rule{Method: unpublishMethod, Latency: 4 * time.Second}); err != nil {
		t.Fatal(err)
	}
	for i := range detaching {
		e.deleteVA(name("old", i))
	}
	inFlight := func() int {
		n := 0
		for _, c := range e.driver.CallsTo(unpublishMethod) {
			if !c.Done() {
				n++
			}
		}
		return n
	}
	e.eventually(30*time.Second, "detach workers saturated", func() (bool, error) { return inFlight() == 10, nil })

	for i := range attaching {
		e.createPV(name("new", i))
		e.createVA(e.newVA(name("new", i), name("new", i), e.node))
	}
	for i := range attaching {
		e.waitAttached(name("new", i), time.Minute)
	}
	unpublishes := e.driver.CallsTo(unpublishMethod)
	done := 0
	for _, c := range unpublishes {
		if c.Done() {
			done++
		}
	}
	// 200 detach passes may run at once (DefaultAPIWorkers of the 10 workers), but the driver
	// never sees more than --worker-threads unpublishes at a time.
	if got := e.driver.Stats().Methods[unpublishMethod].MaxInFlight; got != 10 {
		t.Errorf("most unpublishes in flight at once = %d, want exactly the 10 worker threads", got)
	}
	t.Logf("when the %d new volumes were attached: %d of %d unpublishes done, %d in flight", attaching, done, detaching, len(unpublishes)-done)
	if done >= detaching/2 {
		t.Errorf("%d of %d detaches finished before %d attaches: attaches waited behind the detach burst", done, detaching, attaching)
	}
	// Each new publish ran while a slow unpublish was in flight: the two
	// calls' intervals overlap. (Not "inside one unpublish": the first ten
	// unpublishes all end together 4 s in, and a publish that started
	// before they ended and finished after the next ten started overlaps
	// both batches without lying inside either.)
	for i := range attaching {
		pubs := e.callsFor(publishMethod, name("new", i))
		if len(pubs) != 1 {
			t.Fatalf("publish calls for %s = %d, want 1", name("new", i), len(pubs))
		}
		overlapped := false
		for _, u := range unpublishes {
			if u.Start.Before(pubs[0].End) && (!u.Done() || u.End.After(pubs[0].Start)) {
				overlapped = true
			}
		}
		if !overlapped {
			t.Errorf("publish of %s did not run alongside the detach burst", name("new", i))
		}
	}

	e.driver.ClearFaults()
	for i := range detaching {
		e.waitGone(name("old", i))
	}
	for i := range detaching {
		if pubs := e.driver.Published(name("old", i)); len(pubs) != 0 {
			t.Errorf("%s still published to %v", name("old", i), pubs)
		}
	}
}

// While --worker-threads publishes are in flight, the other attach passes
// do their API writes (PV and VA finalizers, node ID) instead of waiting:
// the driver's concurrency stays bounded, the API work overlaps it.
func TestAttachPassesPrepareWhileCSISlotsAreFull(t *testing.T) {
	const volumes = 25
	e := newEnv(t, envOptions{driverConcurrency: attacher.ConcurrencyFixed})
	name := func(i int) string { return fmt.Sprintf("%s-%02d", e.prefix, i) }
	// The publishes hang until every VA is prepared (a fixed latency
	// let a publish finish first on a loaded machine).
	hang, err := e.driver.AddFault(csimock.Rule{Method: publishMethod, Hang: true})
	if err != nil {
		t.Fatal(err)
	}
	for i := range volumes {
		e.createPV(name(i))
		e.createVA(e.newVA(name(i), name(i), e.node))
	}
	// Before any slow publish can have finished, every VA already carries
	// our finalizer and node ID: 25 passes ran, 10 of them in the driver.
	e.eventually(30*time.Second, "all VAs prepared while publishes are in flight", func() (bool, error) {
		prepared := 0
		for i := range volumes {
			va := e.getVA(name(i))
			if va != nil && len(va.Finalizers) > 0 && va.Annotations[kubenames.VANodeIDAnnotation] != "" {
				prepared++
			}
		}
		for _, c := range e.driver.CallsTo(publishMethod) {
			if c.Done() {
				return false, fmt.Errorf("a publish finished before all %d VAs were prepared (%d were)", volumes, prepared)
			}
		}
		return prepared == volumes, nil
	})
	if got := len(e.driver.CallsTo(publishMethod)); got != 10 {
		t.Errorf("publishes started while the driver holds them = %d, want the 10 worker threads", got)
	}
	if !e.driver.ReleaseHang(hang) {
		t.Fatal("hang rule not found")
	}
	for i := range volumes {
		e.waitAttached(name(i), time.Minute)
	}
	if got := e.driver.Stats().Methods[publishMethod].MaxInFlight; got != 10 {
		t.Errorf("most publishes in flight at once = %d, want exactly the 10 worker threads", got)
	}
	if got := len(e.driver.CallsTo(publishMethod)); got != volumes {
		t.Errorf("publish calls = %d, want one per VA (%d)", got, volumes)
	}
	e.driver.ClearFaults()
}
