package attacher

import "sync"

// direction is which lane of the VolumeAttachment route a pass runs in:
// attaches and detaches keep workers and CSI call slots of their own, so a
// burst of one never starves the other.
type direction int

const (
	attachDir direction = iota
	detachDir
	// nowhere: the pass left nothing for another lane.
	nowhere direction = -1
)

// laneOf is the lane va's work belongs in: a VolumeAttachment being
// deleted is detached, any other attached.
func laneOf(deleting bool) direction {
	if deleting {
		return detachDir
	}
	return attachDir
}

// route owns where a VolumeAttachment's work runs: one pass at a time,
// in one lane, per name. A pass takes the name before it reads the object
// and gives it back when done, saying in which lane the name must run next
// (a pass that finds the object belongs to the other lane does no work
// there); route, never the pass, enqueues it. A pass that finds the name
// held by the other lane does not poll: it is recorded as waiting and
// woken by the release.
type route struct {
	mu sync.Mutex
	// held maps a name a pass works on to the lanes waiting for it.
	held map[string]*[2]bool
	// wake enqueues name in the lane dir.
	wake func(dir direction, name string)
}

func newRoute(wake func(direction, string)) *route {
	return &route{held: map[string]*[2]bool{}, wake: wake}
}

// take makes the caller name's owner and returns true, or, when another
// pass holds it, records dir as waiting and returns false: release wakes it.
func (r *route) take(dir direction, name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if waiting, ok := r.held[name]; ok {
		waiting[dir] = true
		return false
	}
	r.held[name] = &[2]bool{}
	return true
}

// release ends the caller's ownership of name and wakes the lanes that
// found it held meanwhile, and next, the lane the pass says the name
// belongs in now (nowhere: none).
func (r *route) release(name string, next direction) {
	r.mu.Lock()
	waiting := r.held[name]
	delete(r.held, name)
	r.mu.Unlock()
	if waiting == nil {
		waiting = &[2]bool{}
	}
	if next != nowhere {
		waiting[next] = true
	}
	for dir, w := range waiting {
		if w {
			r.wake(direction(dir), name)
		}
	}
}

// enqueue wakes name in the lane dir.
func (c *Controller) enqueue(dir direction, name string) {
	if dir == attachDir {
		c.attach.Enqueue(name)
	} else {
		c.detach.Enqueue(name)
	}
}
