package kube

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/record"
)

// fakeEventSink records creates; each create waits for gate (when set)
// and answers with the next scripted error for its event name.
type fakeEventSink struct {
	mu          sync.Mutex
	gate        chan struct{}
	errs        map[string][]error
	calls       map[string]int
	created     []string
	inFlight    int
	maxInFlight int
}

func newFakeEventSink() *fakeEventSink {
	return &fakeEventSink{errs: map[string][]error{}, calls: map[string]int{}}
}

func (f *fakeEventSink) Create(e *v1.Event) (*v1.Event, error) {
	f.mu.Lock()
	f.inFlight++
	f.maxInFlight = max(f.maxInFlight, f.inFlight)
	f.calls[e.Name]++
	var err error
	if q := f.errs[e.Name]; len(q) > 0 {
		err, f.errs[e.Name] = q[0], q[1:]
	}
	gate := f.gate
	f.mu.Unlock()
	if gate != nil {
		<-gate
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inFlight--
	if err != nil {
		return nil, err
	}
	f.created = append(f.created, e.Name)
	return e, nil
}

func (f *fakeEventSink) Update(e *v1.Event) (*v1.Event, error) { return e, nil }
func (f *fakeEventSink) Patch(e *v1.Event, _ []byte) (*v1.Event, error) {
	return e, nil
}

func (f *fakeEventSink) snapshot() (created []string, inFlight, maxInFlight int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.created...), f.inFlight, f.maxInFlight
}

func event(name string) *v1.Event {
	return &v1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}, Reason: "SuccessfulAttachVolume"}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestConcurrentEventSink_slowServer_createsOverlapUpToTheBoundAndNoneIsLost(t *testing.T) {
	fake := newFakeEventSink()
	fake.gate = make(chan struct{})
	s := NewConcurrentEventSink(t.Context(), fake, 3)

	returned := make(chan string, 5)
	go func() {
		for i := range 5 {
			name := fmt.Sprintf("ev-%d", i)
			got, err := s.Create(event(name))
			if err != nil || got.Name != name {
				t.Errorf("Create(%s) = %v, %v; want the event back at once", name, got, err)
			}
			returned <- name
		}
	}()
	// Three creates go out at once and return; the fourth waits for a slot.
	waitUntil(t, "three creates are in flight", func() bool { _, n, _ := fake.snapshot(); return n == 3 })
	for range 3 {
		<-returned
	}
	select {
	case name := <-returned:
		t.Fatalf("Create(%s) returned while three creates were outstanding", name)
	case <-time.After(50 * time.Millisecond):
	}
	close(fake.gate)
	for range 2 {
		<-returned
	}
	s.Wait()
	created, _, maxInFlight := fake.snapshot()
	if len(created) != 5 || maxInFlight != 3 {
		t.Errorf("created %v with at most %d in flight, want all 5 with 3", created, maxInFlight)
	}
}

func TestConcurrentEventSink_transportErrorIsRetried_refusalIsNot(t *testing.T) {
	fake := newFakeEventSink()
	gr := schema.GroupResource{Resource: "events"}
	fake.errs["flaky"] = []error{errors.New("connection refused"), errors.New("connection reset")}
	fake.errs["refused"] = []error{apierrors.NewBadRequest("invalid event")}
	fake.errs["exists"] = []error{apierrors.NewAlreadyExists(gr, "exists")}
	fake.errs["down"] = []error{errors.New("a"), errors.New("b"), errors.New("c"), errors.New("d"), errors.New("e")}
	s := NewConcurrentEventSink(t.Context(), fake, 4)
	var slept []time.Duration
	var mu sync.Mutex
	s.sleep = func(_ context.Context, d time.Duration) bool {
		mu.Lock()
		defer mu.Unlock()
		slept = append(slept, d)
		return true
	}
	for _, name := range []string{"flaky", "refused", "exists", "down"} {
		if _, err := s.Create(event(name)); err != nil {
			t.Fatalf("Create(%s): %v", name, err)
		}
	}
	s.Wait()
	want := map[string]int{"flaky": 3, "refused": 1, "exists": 1, "down": eventCreateTries}
	for name, n := range want {
		if fake.calls[name] != n {
			t.Errorf("%s: %d create calls, want %d", name, fake.calls[name], n)
		}
	}
	created, _, _ := fake.snapshot()
	if len(created) != 1 || created[0] != "flaky" {
		t.Errorf("created %v, want only the retried one", created)
	}
	if len(slept) != 2+eventCreateTries-1 {
		t.Errorf("backoffs %v, want %d", slept, 2+eventCreateTries-1)
	}
}

func TestConcurrentEventSink_behindTheBroadcaster_eventsOfABurstGoOutSideBySide(t *testing.T) {
	fake := newFakeEventSink()
	fake.gate = make(chan struct{})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	s := NewConcurrentEventSink(ctx, fake, 8)
	b := record.NewBroadcaster(record.WithContext(ctx))
	defer b.Shutdown()
	b.StartRecordingToSink(s)
	rec := b.NewRecorder(scheme.Scheme, v1.EventSource{Component: "test"})
	const n = 40
	for i := range n {
		pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("pod-%d", i), UID: "u"}}
		rec.Event(pod, v1.EventTypeNormal, "SuccessfulAttachVolume", "attached")
	}
	// A synchronous sink would hold the broadcaster at one create.
	waitUntil(t, "eight creates are in flight", func() bool { _, n, _ := fake.snapshot(); return n == 8 })
	close(fake.gate)
	waitUntil(t, "every event is created", func() bool { c, _, _ := fake.snapshot(); return len(c) == n })
	s.Wait()
	if _, _, m := fake.snapshot(); m != 8 {
		t.Errorf("at most %d creates in flight, want 8", m)
	}
}
