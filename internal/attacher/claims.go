package attacher

import "sync"

// Direction is which of the two VolumeAttachment queues a pass runs in.
type direction int

const (
	attachDir direction = iota
	detachDir
)

// claims makes one pass at a time the owner of a VolumeAttachment's
// in-flight work. Attach and detach keep queues, workers and CSI call
// slots of their own (a burst of one never starves the other), but they
// must never work on the same VolumeAttachment at once. A pass that finds
// the name claimed by the other direction does not poll: it is recorded as
// waiting, returns, and release re-enqueues its key in its own queue, so
// the waiter runs as soon as the owner is done.
type claims struct {
	mu sync.Mutex
	// held maps a claimed name to the directions waiting for it.
	held map[string]*[2]bool
	// wake re-enqueues name in the queue of dir.
	wake func(dir direction, name string)
}

func newClaims(wake func(direction, string)) *claims {
	return &claims{held: map[string]*[2]bool{}, wake: wake}
}

// claim makes the caller name's owner and returns true, or, when another
// pass owns it, records dir as waiting and returns false: release wakes it.
func (c *claims) claim(dir direction, name string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if waiting, ok := c.held[name]; ok {
		waiting[dir] = true
		return false
	}
	c.held[name] = &[2]bool{}
	return true
}

// release ends the caller's ownership of name and wakes the passes that
// found it claimed meanwhile.
func (c *claims) release(name string) {
	c.mu.Lock()
	waiting := c.held[name]
	delete(c.held, name)
	c.mu.Unlock()
	if waiting == nil {
		return
	}
	for dir, w := range waiting {
		if w {
			c.wake(direction(dir), name)
		}
	}
}

// enqueue wakes name in the queue of dir.
func (c *Controller) enqueue(dir direction, name string) {
	if dir == attachDir {
		c.attach.Enqueue(name)
	} else {
		c.detach.Enqueue(name)
	}
}
