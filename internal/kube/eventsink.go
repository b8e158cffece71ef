package kube

import (
	"context"
	"errors"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
)

// DefaultEventCreatesInFlight bounds how many event creates a
// ConcurrentEventSink has outstanding.
const DefaultEventCreatesInFlight = 16

// eventCreateTries and eventCreateBackoff bound the retries of a create
// that failed before the API server answered (a transport error).
const (
	eventCreateTries   = 4
	eventCreateBackoff = time.Second
)

// ConcurrentEventSink is a record.EventSink whose creates overlap.
//
// client-go's broadcaster hands events to its sink one at a time and
// drops whatever exceeds a queue of 1,000. With one API round trip per
// event, a burst of attaches makes events faster than a busy API server
// takes them one by one: they arrive seconds late, and past the queue they
// are lost. Create therefore sends the event in the background and returns
// it at once, named as the server will name it (the recorder names events
// itself); it blocks only while inFlight creates are outstanding, so the
// broadcaster's queue still bounds the memory. Patch and Update (the
// correlator's count updates of a repeated event) stay synchronous.
//
// What a synchronous sink tells the broadcaster and Create cannot: a
// create the server refused is logged here, not retried by the
// broadcaster; a count update racing the create of its event may find it
// missing, in which case the broadcaster creates it again and whichever
// create lands second is refused as AlreadyExists (the event keeps the
// first count).
type ConcurrentEventSink struct {
	sink   record.EventSink
	ctx    context.Context
	slots  chan struct{}
	wg     sync.WaitGroup
	sleep  func(context.Context, time.Duration) bool
	logger klog.Logger
}

var _ record.EventSink = (*ConcurrentEventSink)(nil)

// NewEventSink is where both binaries' events go: client's Events API
// behind a ConcurrentEventSink with DefaultEventCreatesInFlight.
func NewEventSink(ctx context.Context, client kubernetes.Interface) *ConcurrentEventSink {
	return NewConcurrentEventSink(ctx, &typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")}, DefaultEventCreatesInFlight)
}

// NewConcurrentEventSink wraps sink. Creates started after ctx is done
// are not retried.
func NewConcurrentEventSink(ctx context.Context, sink record.EventSink, inFlight int) *ConcurrentEventSink {
	if inFlight <= 0 {
		inFlight = DefaultEventCreatesInFlight
	}
	return &ConcurrentEventSink{
		sink: sink, ctx: ctx, slots: make(chan struct{}, inFlight),
		sleep: sleepCtx, logger: klog.FromContext(ctx),
	}
}

// Create starts sending e and returns it.
func (s *ConcurrentEventSink) Create(e *v1.Event) (*v1.Event, error) {
	s.slots <- struct{}{}
	ev := e.DeepCopy()
	s.wg.Add(1)
	go func() {
		defer func() {
			<-s.slots
			s.wg.Done()
		}()
		s.create(ev)
	}()
	return e, nil
}

func (s *ConcurrentEventSink) create(e *v1.Event) {
	var err error
	try := 1
	for ; ; try++ {
		if _, err = s.sink.Create(e); err == nil {
			return
		}
		var status apierrors.APIStatus
		if errors.As(err, &status) {
			if apierrors.IsAlreadyExists(err) {
				s.logger.V(5).Info("Event already exists", "event", klog.KObj(e), "reason", e.Reason)
			} else {
				s.logger.Error(err, "Server rejected event (not retried)", "event", klog.KObj(e), "reason", e.Reason)
			}
			return
		}
		if try >= eventCreateTries || !s.sleep(s.ctx, time.Duration(try)*eventCreateBackoff) {
			break
		}
	}
	s.logger.Error(err, "Unable to write event", "event", klog.KObj(e), "reason", e.Reason, "tries", try)
}

// Update is the wrapped sink's.
func (s *ConcurrentEventSink) Update(e *v1.Event) (*v1.Event, error) { return s.sink.Update(e) }

// Patch is the wrapped sink's.
func (s *ConcurrentEventSink) Patch(e *v1.Event, data []byte) (*v1.Event, error) {
	return s.sink.Patch(e, data)
}

// Wait returns once every create started so far has ended.
func (s *ConcurrentEventSink) Wait() { s.wg.Wait() }

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
