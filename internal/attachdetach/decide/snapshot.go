package decide

import (
	"cmp"
	"slices"

	"github.com/latchcsi/latch/internal/attachdetach/state"
)

// Snapshot is what the desired and actual state hold about one volume: a
// copy taken under each cache's lock (one read of each), shared with
// nothing. Decisions are made on it, never on the live caches.
type Snapshot struct {
	// Wanted is the volume wanted on every node, sorted by node.
	Wanted []state.NodeWanted
	// Actual is the volume's actual state entry on every node, sorted by
	// node.
	Actual []state.Attachment
}

// Gather copies the desired and actual state of key's volume (one locked
// read of each cache) and returns the Input they imply; the caller adds
// Node, CSINode, VA, Listing, Config and Now. The two caches are read one
// after the other, not atomically: a concurrent change enqueues the key
// again, and the next pass sees it.
func Gather(key state.Key, dsw *state.Desired, asw *state.Actual) Input {
	return FromSnapshot(key, Snapshot{Wanted: dsw.WantedForVolume(key.Volume), Actual: asw.ForVolume(key.Volume)})
}

// FromSnapshot returns the Input for key that s implies: the key's own
// wanted and actual entries, and every other node of the volume as a Peer
// (sorted by node). It is pure; the Input shares no memory with the
// caches.
func FromSnapshot(key state.Key, s Snapshot) Input {
	in := Input{Key: key}
	peers := map[string]*Peer{}
	peer := func(node string) *Peer {
		p := peers[node]
		if p == nil {
			p = &Peer{Node: node}
			peers[node] = p
		}
		return p
	}
	for _, e := range s.Actual {
		if e.Node == key.Node {
			in.Actual = &e
			continue
		}
		p := peer(e.Node)
		p.State = e.State
		if e.Spec != nil {
			p.Specs = append(p.Specs, *e.Spec)
		}
	}
	for _, w := range s.Wanted {
		if w.Node == key.Node {
			wanted := w.Wanted
			in.Wanted = &wanted
			continue
		}
		p := peer(w.Node)
		p.Pods = w.Pods
		p.Specs = append(p.Specs, w.Specs...)
	}
	for _, p := range peers {
		in.Peers = append(in.Peers, *p)
	}
	slices.SortFunc(in.Peers, func(a, b Peer) int { return cmp.Compare(a.Node, b.Node) })
	return in
}
