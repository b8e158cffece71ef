package controller

import (
	"slices"
	"sync"
)

// returningNodes holds, for each node that came back after the rebuild (its
// Node object re-created, or its controller-managed annotation set again),
// the Pods on it whose pass has not yet recorded them again.
//
// Deleting a Node, or taking the annotation off, drops the volumes its
// Pods want from the desired state (docs/conformance.md, deliberate
// difference 9). When the Node comes back its Pods are recorded again by
// the Pod queue, but a key pass can run first: the volume of a Pod still
// running there then looks unwanted, and a re-registered Node's empty
// volumesInUse makes it look unmounted, so it would be detached under the
// Pod. While a node has Pods here, nothing on it is detached
// (decide.NodeFacts.PodsPending); the last Pod's pass wakes the node's
// keys.
type returningNodes struct {
	mu sync.Mutex
	// pods: node → the Pod keys not yet recorded again.
	pods map[string]map[string]struct{}
	// nodesOf: Pod key → the nodes in pods that wait for it (one, but a
	// Pod deleted and created again under its name on another node may
	// be waited for by both).
	nodesOf map[string][]string
}

func newReturningNodes() *returningNodes {
	return &returningNodes{pods: map[string]map[string]struct{}{}, nodesOf: map[string][]string{}}
}

// start notes that node came back with the Pods podKeys on it; it
// replaces what an earlier return of node left. No Pods: nothing to wait
// for.
func (r *returningNodes) start(node string, podKeys []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.forgetLocked(node)
	if len(podKeys) == 0 {
		return
	}
	set := make(map[string]struct{}, len(podKeys))
	for _, k := range podKeys {
		set[k] = struct{}{}
		r.nodesOf[k] = append(r.nodesOf[k], node)
	}
	r.pods[node] = set
}

// recorded notes that the Pod podKey's pass succeeded and is done with
// every node waiting for it but notRecordedOn ("": none), the node of a
// Pod that needs its volumes there and was not recorded: that node keeps
// waiting for a later pass. It returns the nodes for which that was the
// last Pod still to record: their keys must be woken.
func (r *returningNodes) recorded(podKey, notRecordedOn string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var released, waiting []string
	for _, node := range r.nodesOf[podKey] {
		if node == notRecordedOn {
			waiting = append(waiting, node)
			continue
		}
		set := r.pods[node]
		delete(set, podKey)
		if len(set) == 0 {
			delete(r.pods, node)
			released = append(released, node)
		}
	}
	if len(waiting) > 0 {
		r.nodesOf[podKey] = waiting
	} else {
		delete(r.nodesOf, podKey)
	}
	return released
}

// pending reports how many Pods of node are still to be recorded again.
func (r *returningNodes) pending(node string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.pods[node])
}

// forget drops node (deleted again, or no longer managed).
func (r *returningNodes) forget(node string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.forgetLocked(node)
}

func (r *returningNodes) forgetLocked(node string) {
	for k := range r.pods[node] {
		nodes := slices.DeleteFunc(r.nodesOf[k], func(n string) bool { return n == node })
		if len(nodes) == 0 {
			delete(r.nodesOf, k)
		} else {
			r.nodesOf[k] = nodes
		}
	}
	delete(r.pods, node)
}
