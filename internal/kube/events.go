package kube

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
)

// EventsStopTimeout bounds how long Events.Stop waits for the events
// recorded so far to reach the API server.
const EventsStopTimeout = 5 * time.Second

// Events is where a binary's events go: a broadcaster that records to the
// API server through a ConcurrentEventSink and keeps doing so after the
// process's context is done, until Stop.
//
// A broadcaster tied to the process's context (record.WithContext) shuts
// down the moment SIGTERM arrives, while the workers still drain and
// before the leader elector records "stopped leading" on releasing its
// Lease: each of those events is lost and logged as "Unable to record
// event (will not retry!)". The owner of an Events calls Stop once nothing
// records any more: after the workers stopped and the Lease was released.
type Events struct {
	broadcaster record.EventBroadcaster
	sink        *ConcurrentEventSink
	flushes     *flushSink
	logger      klog.Logger
	seq         atomic.Uint64
	stopOnce    sync.Once
}

// StartEvents starts an Events that sends to client's Events API. ctx
// gives the logger and ends the retries of creates that failed before the
// API server answered; it does not stop the broadcaster.
func StartEvents(ctx context.Context, client kubernetes.Interface) *Events {
	return startEvents(ctx, &typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")}, DefaultEventCreatesInFlight)
}

func startEvents(ctx context.Context, sink record.EventSink, inFlight int) *Events {
	e := &Events{
		broadcaster: record.NewBroadcaster(record.WithContext(context.WithoutCancel(ctx))),
		sink:        NewConcurrentEventSink(ctx, sink, inFlight),
		logger:      klog.FromContext(ctx),
	}
	e.flushes = &flushSink{EventSink: e.sink, waiting: map[string]chan struct{}{}}
	e.broadcaster.StartRecordingToSink(e.flushes)
	return e
}

// NewRecorder returns a recorder of events from source.
func (e *Events) NewRecorder(source v1.EventSource) record.EventRecorder {
	return e.broadcaster.NewRecorder(scheme.Scheme, source)
}

// LogEvents logs every event at verbosity v, as client-go's
// StartStructuredLogging does (kube-controller-manager logs its events at
// 3).
func (e *Events) LogEvents(v int) {
	logger := e.logger.V(v)
	e.broadcaster.StartEventWatcher(func(ev *v1.Event) {
		if isFlushMarker(ev) {
			return
		}
		logger.Info("Event occurred", "object", klog.KRef(ev.InvolvedObject.Namespace, ev.InvolvedObject.Name), "fieldPath", ev.InvolvedObject.FieldPath,
			"kind", ev.InvolvedObject.Kind, "apiVersion", ev.InvolvedObject.APIVersion, "type", ev.Type, "reason", ev.Reason, "message", ev.Message)
	})
}

// Stop hands every event recorded so far to the sink, shuts the
// broadcaster down and waits for the creates in flight, all within
// EventsStopTimeout. Nothing may be recorded after Stop. It is idempotent.
func (e *Events) Stop() {
	e.stopOnce.Do(func() {
		deadline := time.NewTimer(EventsStopTimeout)
		defer deadline.Stop()
		flushed := e.flush(deadline.C)
		e.broadcaster.Shutdown()
		sent := make(chan struct{})
		go func() {
			e.sink.Wait()
			close(sent)
		}()
		select {
		case <-sent:
		case <-deadline.C:
			flushed = false
		}
		if !flushed {
			e.logger.Info("Stopped recording events before all were sent to the API server", "timeout", EventsStopTimeout)
		}
	})
}

// flush passes a marker event through the broadcaster and waits until the
// sink got it: the broadcaster hands events to its sink in order, one at a
// time, so every event recorded before has reached the sink by then.
func (e *Events) flush(deadline <-chan time.Time) bool {
	actor, ok := e.broadcaster.(interface {
		Action(watch.EventType, runtime.Object) error
	})
	if !ok {
		return false
	}
	name := fmt.Sprintf("%s.%d", flushComponent, e.seq.Add(1))
	seen := e.flushes.expect(name)
	marker := &v1.Event{
		ObjectMeta:     metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: name},
		InvolvedObject: v1.ObjectReference{Kind: flushComponent, Namespace: metav1.NamespaceDefault, Name: name},
		Type:           v1.EventTypeNormal, Reason: flushReason, Source: v1.EventSource{Component: flushComponent},
	}
	if err := actor.Action(watch.Added, marker); err != nil {
		return false
	}
	select {
	case <-seen:
		return true
	case <-deadline:
		return false
	}
}

// The flush marker: never sent to the API server.
const (
	flushComponent = "latch-events-flush"
	flushReason    = "Flush"
)

func isFlushMarker(ev *v1.Event) bool {
	return ev.Source.Component == flushComponent && ev.Reason == flushReason
}

// flushSink takes the flush markers out of the stream of events.
type flushSink struct {
	record.EventSink
	mu      sync.Mutex
	waiting map[string]chan struct{}
}

func (f *flushSink) expect(name string) <-chan struct{} {
	ch := make(chan struct{})
	f.mu.Lock()
	f.waiting[name] = ch
	f.mu.Unlock()
	return ch
}

// Create signals a marker and sends every other event.
func (f *flushSink) Create(ev *v1.Event) (*v1.Event, error) {
	if !isFlushMarker(ev) {
		return f.EventSink.Create(ev)
	}
	f.mu.Lock()
	ch := f.waiting[ev.InvolvedObject.Name]
	delete(f.waiting, ev.InvolvedObject.Name)
	f.mu.Unlock()
	if ch != nil {
		close(ch)
	}
	return ev, nil
}
