package attacher

import (
	"context"
	"errors"
	"fmt"
)

// callSlots bounds how many CSI calls of one kind are in flight. The
// timeout of a call starts only once it holds a slot, so waiting for a slot
// never eats into --timeout.
type callSlots chan struct{}

func newCallSlots(n int) callSlots { return make(callSlots, max(n, 1)) }

// errNoSlot is the error acquire returns (wrapping the context's cause)
// when the context ends before a slot is free: the call was not made.
var errNoSlot = errors.New("wait for a free CSI call slot")

// acquire blocks until a slot is free or ctx ends; the returned release
// must be called exactly once when the call is over.
func (s callSlots) acquire(ctx context.Context) (release func(), err error) {
	select {
	case s <- struct{}{}:
		return func() { <-s }, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: %w", errNoSlot, context.Cause(ctx))
	}
}
