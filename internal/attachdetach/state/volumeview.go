package state

import (
	"cmp"
	"slices"

	v1 "k8s.io/api/core/v1"
)

// NodeWanted is a volume wanted on one node.
type NodeWanted struct {
	Node string
	Wanted
}

// WantedForVolume returns the volume vol as wanted on every node, sorted
// by node, read under one lock: a consistent copy of the desired state of
// one volume (Get per node would read each node at a different moment).
func (d *Desired) WantedForVolume(vol v1.UniqueVolumeName) []NodeWanted {
	d.mu.RLock()
	defer d.mu.RUnlock()
	out := make([]NodeWanted, 0, len(d.volumeNodes[vol]))
	for _, node := range d.volumeNodes[vol] {
		n := d.nodes[node]
		if n == nil {
			continue
		}
		if dv := n.volumes[vol]; dv != nil {
			out = append(out, NodeWanted{Node: node, Wanted: dv.wanted()})
		}
	}
	slices.SortFunc(out, func(a, b NodeWanted) int { return cmp.Compare(a.Node, b.Node) })
	return out
}
