package adaptive

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/klog/v2"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/latchcsi/latch/internal/testsupport/logrec"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// fixed is a Limiter whose limit stays n (Min = Max = n).
func fixed(n int, clk *clocktesting.FakeClock) *Limiter {
	return NewLimiter(Config{Initial: n, Min: n, Max: n}, clk)
}

func acquireNow(t *testing.T, l *Limiter, dir Direction) *Slot {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := l.Acquire(ctx, dir)
	if err != nil {
		t.Fatalf("acquire %s: %v", dir, err)
	}
	return s
}

// waiter starts an Acquire in the background; its channel yields the slot.
func waiter(ctx context.Context, l *Limiter, dir Direction) <-chan *Slot {
	ch := make(chan *Slot, 1)
	go func() {
		s, err := l.Acquire(ctx, dir)
		if err == nil {
			ch <- s
		}
	}()
	return ch
}

func waitQueued(t *testing.T, l *Limiter, dir Direction, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		l.mu.Lock()
		got := len(l.waiting[dir])
		l.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d %s waiters, want %d", got, dir, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestLimiterBoundsCallsInFlight(t *testing.T) {
	l := fixed(3, clocktesting.NewFakeClock(t0))
	slots := []*Slot{acquireNow(t, l, Attach), acquireNow(t, l, Attach), acquireNow(t, l, Detach)}
	fourth := waiter(t.Context(), l, Attach)
	waitQueued(t, l, Attach, 1)
	select {
	case <-fourth:
		t.Fatal("a fourth call started under a limit of 3")
	case <-time.After(50 * time.Millisecond):
	}
	slots[2].Done(Served)
	slots[2].Done(Served) // a second Done frees nothing more
	s := <-fourth
	if a, d := l.InFlight(); a != 3 || d != 0 {
		t.Errorf("in flight = %d attach, %d detach; want 3 and 0", a, d)
	}
	s.Done(Served)
	slots[0].Done(Served)
	slots[1].Done(Served)
	if a, d := l.InFlight(); a != 0 || d != 0 {
		t.Errorf("in flight after every Done = %d, %d", a, d)
	}
}

// A burst of attaches holding every slot does not shut detaches out: as
// slots free, detaches get them until they hold half the limit, then the
// two alternate; alone, either direction may use the whole limit.
func TestLimiterKeepsEachDirectionsShare(t *testing.T) {
	l := fixed(4, clocktesting.NewFakeClock(t0))
	var attaches []*Slot
	for range 4 {
		attaches = append(attaches, acquireNow(t, l, Attach))
	}
	var waitingAttaches []<-chan *Slot
	for i := range 6 {
		waitingAttaches = append(waitingAttaches, waiter(t.Context(), l, Attach))
		waitQueued(t, l, Attach, i+1)
	}
	var detaches []<-chan *Slot
	for i := range 3 {
		detaches = append(detaches, waiter(t.Context(), l, Detach))
		waitQueued(t, l, Detach, i+1)
	}
	attaches[0].Done(Served)
	d1 := <-detaches[0]
	attaches[1].Done(Served)
	d2 := <-detaches[1]
	if a, d := l.InFlight(); a != 2 || d != 2 {
		t.Fatalf("in flight = %d attach, %d detach; want 2 and 2 (each its half)", a, d)
	}
	// Detach holds its half: the next free slot goes to the oldest
	// waiting attach, not to the third detach.
	attaches[2].Done(Served)
	select {
	case <-waitingAttaches[0]:
	case <-time.After(5 * time.Second):
		t.Fatal("the freed slot did not go to the waiting attach")
	}
	select {
	case <-detaches[2]:
		t.Fatal("a third detach started while attaches wait and detaches hold half")
	default:
	}
	d1.Done(Served)
	<-detaches[2]
	d2.Done(Served)
	if a, d := l.InFlight(); a != 3 || d != 1 {
		t.Errorf("in flight = %d attach, %d detach; want 3 and 1", a, d)
	}
}

func TestLimiterAcquireGivesUpWithTheContext(t *testing.T) {
	l := fixed(1, clocktesting.NewFakeClock(t0))
	s := acquireNow(t, l, Attach)
	ctx, cancel := context.WithCancelCause(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := l.Acquire(ctx, Attach)
		errc <- err
	}()
	waitQueued(t, l, Attach, 1)
	cause := errors.New("queue shutting down")
	cancel(cause)
	err := <-errc
	if !errors.Is(err, ErrNoSlot) || !errors.Is(err, cause) {
		t.Fatalf("Acquire = %v, want ErrNoSlot wrapping the cause", err)
	}
	waitQueued(t, l, Attach, 0)
	s.Done(Served)
	if a, _ := l.InFlight(); a != 0 {
		t.Errorf("%d attach slots held after the waiter gave up and the holder finished", a)
	}
	acquireNow(t, l, Attach).Done(Served)
}

// A throttled call's slot is kept for one period after its answer: the
// call cannot come straight back.
func TestLimiterKeepsAThrottledCallsSlotForAPeriod(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	l := NewLimiter(Config{Initial: 4, Min: 1, Max: 4}, clk)
	for range 4 {
		s := acquireNow(t, l, Attach)
		clk.Step(100 * time.Millisecond)
		s.Done(Served)
	}
	s := acquireNow(t, l, Attach)
	s.Done(Throttled)
	if got := l.Limit(); got != 2 {
		t.Errorf("limit after a throttled answer = %d, want 4 × 0.7 rounded down = 2", got)
	}
	if a, _ := l.InFlight(); a != 1 {
		t.Fatalf("slot of the throttled call freed at once: %d held", a)
	}
	// The period is the calls' latency, 100 ms.
	deadline := time.Now().Add(5 * time.Second)
	for clk.HasWaiters() == false && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	clk.Step(100 * time.Millisecond)
	for time.Now().Before(deadline) {
		if a, _ := l.InFlight(); a == 0 {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Error("slot of the throttled call still held a period after its answer")
}

func TestLimiterReportsLimitChanges(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	l := NewLimiter(Config{Initial: 10, Min: 1, Max: 100}, clk)
	var got []int
	l.OnLimitChange(func(n int) { got = append(got, n) })
	s := acquireNow(t, l, Detach)
	s.Done(Throttled)
	if len(got) != 2 || got[0] != 10 || got[1] != 7 {
		t.Errorf("limit changes reported = %v, want [10 7]", got)
	}
	if l.Throttled() != 1 {
		t.Errorf("throttled = %d, want 1", l.Throttled())
	}
}

// Many callers of both directions under a limit that moves: the slots held
// never exceed the limit's bound, and every caller gets through.
func TestLimiterUnderConcurrentUse(t *testing.T) {
	l := NewLimiter(Config{Initial: 4, Min: 2, Max: 8}, nil)
	var held, most atomic.Int64
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Go(func() {
			dir := Direction(i % 2)
			for j := range 20 {
				s, err := l.Acquire(t.Context(), dir)
				if err != nil {
					t.Error(err)
					return
				}
				n := held.Add(1)
				for {
					m := most.Load()
					if n <= m || most.CompareAndSwap(m, n) {
						break
					}
				}
				time.Sleep(time.Duration(j%3) * 100 * time.Microsecond)
				held.Add(-1)
				outcome := Served
				if j%17 == 0 {
					outcome = Ignored
				}
				s.Done(outcome)
			}
		})
	}
	wg.Wait()
	if m := most.Load(); m > 8 {
		t.Errorf("%d calls in flight at once, above the bound 8", m)
	}
	if a, d := l.InFlight(); a != 0 || d != 0 {
		t.Errorf("slots held after every caller finished: %d, %d", a, d)
	}
}

// A change of the limit is logged at V(4) with the caller's logger (the
// pass whose call's answer changed it), saying why: an operator who sees
// VolumeAttachments wait for CSI call slots reads there how the limit
// moves.
func TestLimiterLogsWhyTheLimitChanged(t *testing.T) {
	logger, rec := logrec.New(4)
	clk := clocktesting.NewFakeClock(t0)
	l := NewLimiter(Config{Initial: 2, Min: 1, Max: 10}, clk)
	ctx := klog.NewContext(context.Background(), logger.WithValues("call", "x"))
	a, err := l.Acquire(ctx, Attach)
	if err != nil {
		t.Fatal(err)
	}
	b, err := l.Acquire(ctx, Attach)
	if err != nil {
		t.Fatal(err)
	}
	clk.Step(100 * time.Millisecond)
	a.Done(Served) // slow start: 2 in flight of 2, the limit grows to 3
	clk.Step(time.Millisecond)
	b.Done(Throttled)
	lines := rec.Lines()
	want := []string{
		`"level"=4 "msg"="CSI call limit changed" "call"="x" "limit"=3 "was"=2 "reason"="` + ReasonSlowStart + `"`,
		`"level"=4 "msg"="CSI call limit changed" "call"="x" "limit"=2 "was"=3 "reason"="` + ReasonThrottled + `"`,
	}
	if len(lines) != len(want) {
		t.Fatalf("logged %d lines, want %d: %q", len(lines), len(want), lines)
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("line %d = %s\nwant it to start with %s", i, lines[i], w)
		}
	}
	if !strings.Contains(lines[1], `"throttledTotal"=1`) {
		t.Errorf("the throttled change does not count the throttled answer: %s", lines[1])
	}
}

// Waiting reports the calls of each direction waiting for a slot and how
// long the oldest has waited, for csi-attacher's metrics: a call that gets
// its slot or gives up no longer counts.
func TestLimiterReportsTheCallsWaitingAndTheOldestWait(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	l := fixed(1, clk)
	if n, oldest := l.Waiting(Attach); n != 0 || oldest != 0 {
		t.Fatalf("before any call: %d waiting, oldest %s; want none", n, oldest)
	}
	held := acquireNow(t, l, Attach)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := waiter(context.Background(), l, Attach)
	waitQueued(t, l, Attach, 1)
	clk.Step(3 * time.Second)
	waiter(ctx, l, Attach)
	waitQueued(t, l, Attach, 2)
	clk.Step(2 * time.Second)
	if n, oldest := l.Waiting(Attach); n != 2 || oldest != 5*time.Second {
		t.Errorf("two waiting since 5 s and 2 s: Waiting = %d, %s; want 2, 5s", n, oldest)
	}
	if n, oldest := l.Waiting(Detach); n != 0 || oldest != 0 {
		t.Errorf("no detach waits: Waiting(Detach) = %d, %s", n, oldest)
	}
	held.Done(Served)
	s := <-first
	if n, oldest := l.Waiting(Attach); n != 1 || oldest != 2*time.Second {
		t.Errorf("after the oldest got its slot: Waiting = %d, %s; want 1, 2s", n, oldest)
	}
	cancel()
	waitQueued(t, l, Attach, 0)
	if n, oldest := l.Waiting(Attach); n != 0 || oldest != 0 {
		t.Errorf("after the last gave up: Waiting = %d, %s; want none", n, oldest)
	}
	s.Done(Served)
}
