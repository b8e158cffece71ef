package stack

import (
	"context"
	"errors"
	"fmt"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"
)

// Component is one running piece of the stack (a goroutine or a child
// process).
type Component struct {
	name   string
	cancel context.CancelFunc
	// exited is closed when run returned; result is what it returned.
	exited chan struct{}
	result error
	once   sync.Once
	err    error
	// killed: Kill ended it; what it returns is no error of the stack's.
	killed atomic.Bool
	// restarts counts a supervised component's restarts (nil: none).
	restarts *atomic.Int32
	// StopTimeout bounds Stop's wait (a minute unless set).
	StopTimeout time.Duration
}

// Go runs run as a component named name: its goroutines carry the pprof
// label component=name and its logger is named name. run's context ends at
// Stop. A run that returns context.Canceled after Stop stopped cleanly.
func Go(ctx context.Context, name string, run func(context.Context) error) *Component {
	ctx, cancel := context.WithCancel(ctx)
	ctx = klog.NewContext(ctx, klog.FromContext(ctx).WithName(name))
	c := &Component{name: name, cancel: cancel, exited: make(chan struct{})}
	go pprof.Do(ctx, pprof.Labels("component", name), func(ctx context.Context) {
		defer close(c.exited)
		c.result = run(ctx)
	})
	return c
}

// Name is the component's name.
func (c *Component) Name() string { return c.name }

// Exited is closed when the component's run returned (on its own or
// after Stop); Result then says what it returned.
func (c *Component) Exited() <-chan struct{} { return c.exited }

// Result is what run returned; call it after Exited is closed.
func (c *Component) Result() error { return c.result }

// Kill ends the component's context without waiting for it (a SIGKILL
// stand-in when its network was cut first). What a killed component
// returns is not reported (by Stop or Stack.Err): a killed process's
// exit status is no failure.
func (c *Component) Kill() {
	c.killed.Store(true)
	c.cancel()
}

// Restarts is how often a supervised component (RestartingAttacher)
// restarted; 0 for the others.
func (c *Component) Restarts() int {
	if c.restarts == nil {
		return 0
	}
	return int(c.restarts.Load())
}

// Stop ends the component and waits for it; the error is run's, if it
// failed with anything but a cancellation, or a timeout.
func (c *Component) Stop() error {
	c.once.Do(func() {
		c.cancel()
		timeout := c.StopTimeout
		if timeout == 0 {
			timeout = time.Minute
		}
		select {
		case <-c.exited:
			if err := c.result; err != nil && !errors.Is(err, context.Canceled) && !c.killed.Load() {
				c.err = fmt.Errorf("%s: %w", c.name, err)
			}
		case <-time.After(timeout):
			c.err = fmt.Errorf("%s did not stop within %s", c.name, timeout)
		}
	})
	return c.err
}
