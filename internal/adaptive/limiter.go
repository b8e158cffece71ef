package adaptive

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// Direction is the kind of call a slot is for. Attaches and detaches share
// one limit (they load the same backend) but neither starves the other.
type Direction int

const (
	Attach Direction = iota
	Detach
	directions
)

func (d Direction) String() string {
	if d == Detach {
		return "detach"
	}
	return "attach"
}

// ErrNoSlot is what Acquire returns (wrapping the context's cause) when
// the context ends before a slot is free: the call was not made.
var ErrNoSlot = errors.New("wait for a free CSI call slot")

// Limiter hands out call slots under Control's limit. While both
// directions have calls waiting, each may hold at most half the limit
// (rounded up) beyond what it already holds, so a burst of one direction
// never shuts the other out; while only one waits, it may use the whole
// limit. Waiters of a direction are served in order.
type Limiter struct {
	clock clock.WithTicker
	mu    sync.Mutex
	ctl   *Control
	held  [directions]int
	// waiting are the waiters of each direction, oldest first.
	waiting [directions][]waitingCall
	// onChange, when set, is told the limit after every change (for a
	// metric), outside the lock.
	onChange func(limit int)
}

// NewLimiter returns a Limiter under a Control of cfg.
func NewLimiter(cfg Config, clk clock.WithTicker) *Limiter {
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &Limiter{clock: clk, ctl: NewControl(cfg)}
}

// OnLimitChange makes the Limiter call f with the new limit after each
// change (and once now).
func (l *Limiter) OnLimitChange(f func(limit int)) {
	l.mu.Lock()
	l.onChange = f
	limit := l.ctl.Limit()
	l.mu.Unlock()
	f(limit)
}

// Limit is the current limit.
func (l *Limiter) Limit() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ctl.Limit()
}

// InFlight is how many slots of each direction are held.
func (l *Limiter) InFlight() (attach, detach int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.held[Attach], l.held[Detach]
}

// Period is the backend's current mean latency (the control's period);
// 0 before the first answers.
func (l *Limiter) Period() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ctl.Period()
}

// Throttled is the number of throttled answers reported.
func (l *Limiter) Throttled() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ctl.Throttled()
}

// waitingCall is a call waiting for a slot: closing ready grants it one; since
// is when it began to wait.
type waitingCall struct {
	ready chan struct{}
	since time.Time
}

// Waiting is how many calls of dir wait for a slot, and how long the
// oldest of them has waited (0 when none does).
func (l *Limiter) Waiting(dir Direction) (n int, oldest time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.waiting[dir]
	if len(w) == 0 {
		return 0, 0
	}
	return len(w), l.clock.Since(w[0].since)
}

// Slot is one call's place under the limit. Done must be called exactly
// once, when the call has answered.
type Slot struct {
	l     *Limiter
	dir   Direction
	start time.Time
	// logger is the caller's (from Acquire's context): a change of the
	// limit that the call's answer makes is logged with it.
	logger klog.Logger
	once   sync.Once
}

// slot is the Slot of a call of dir that starts now, logging with ctx's
// logger.
func (l *Limiter) slot(ctx context.Context, dir Direction) *Slot {
	return &Slot{l: l, dir: dir, start: l.clock.Now(), logger: klog.FromContext(ctx)}
}

// Acquire waits until dir may start a call, or ctx ends (ErrNoSlot
// wrapping the context's cause).
func (l *Limiter) Acquire(ctx context.Context, dir Direction) (*Slot, error) {
	l.mu.Lock()
	if len(l.waiting[dir]) == 0 && l.mayStartLocked(dir) {
		l.held[dir]++
		l.mu.Unlock()
		return l.slot(ctx, dir), nil
	}
	ready := make(chan struct{})
	l.waiting[dir] = append(l.waiting[dir], waitingCall{ready: ready, since: l.clock.Now()})
	l.mu.Unlock()
	select {
	case <-ready:
		return l.slot(ctx, dir), nil
	case <-ctx.Done():
		l.mu.Lock()
		defer l.mu.Unlock()
		select {
		case <-ready:
			// Granted while giving up: hand the slot on.
			l.held[dir]--
			l.wakeLocked()
		default:
			for i, w := range l.waiting[dir] {
				if w.ready == ready {
					l.waiting[dir] = append(l.waiting[dir][:i], l.waiting[dir][i+1:]...)
					break
				}
			}
		}
		return nil, fmt.Errorf("%w: %w", ErrNoSlot, context.Cause(ctx))
	}
}

// mayStartLocked reports whether dir may take one more slot now.
func (l *Limiter) mayStartLocked(dir Direction) bool {
	limit := l.ctl.Limit()
	if l.held[Attach]+l.held[Detach] >= limit {
		return false
	}
	other := Attach
	if dir == Attach {
		other = Detach
	}
	if len(l.waiting[other]) > 0 && l.held[dir] >= (limit+1)/2 {
		// Both directions want slots: this one has its half.
		return false
	}
	return true
}

// wakeLocked grants slots to waiters while the limit allows, taking the
// directions in turn.
func (l *Limiter) wakeLocked() {
	for progress := true; progress; {
		progress = false
		for _, dir := range []Direction{Detach, Attach} {
			if len(l.waiting[dir]) > 0 && l.mayStartLocked(dir) {
				w := l.waiting[dir][0]
				l.waiting[dir] = l.waiting[dir][1:]
				l.held[dir]++
				close(w.ready)
				progress = true
			}
		}
	}
}

// Done reports the call's outcome and frees its slot. A throttled call's
// slot is kept for one period (the backend's current latency) before it
// is freed, so that refused calls come back no faster than served ones.
func (s *Slot) Done(outcome Outcome) {
	s.once.Do(func() {
		l := s.l
		now := l.clock.Now()
		l.mu.Lock()
		before := l.ctl.Limit()
		inFlight := l.held[Attach] + l.held[Detach]
		l.ctl.Sample(now, outcome, now.Sub(s.start), inFlight)
		hold := time.Duration(0)
		if outcome == Throttled {
			hold = l.ctl.Period()
		}
		after, notify := l.ctl.Limit(), l.onChange
		if after != before {
			s.logger.V(4).Info("CSI call limit changed", "limit", after, "was", before, "reason", l.ctl.Reason(),
				"latency", l.ctl.Period(), "baseline", l.ctl.Baseline(), "inFlight", inFlight, "throttledTotal", l.ctl.Throttled())
		}
		if hold <= 0 {
			l.held[s.dir]--
			l.wakeLocked()
		}
		l.mu.Unlock()
		if hold > 0 {
			t := l.clock.NewTimer(hold)
			go func() {
				<-t.C()
				l.mu.Lock()
				l.held[s.dir]--
				l.wakeLocked()
				l.mu.Unlock()
			}()
		}
		if notify != nil && after != before {
			notify(after)
		}
	})
}
