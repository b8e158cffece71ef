package state

// The desired state's whole-state reads, for the controller's periodic
// verify pass (which re-checks the keys a lost wake-up would leave alone).

// KeysAnyOrder returns every wanted key, in no order.
func (d *Desired) KeysAnyOrder() []Key {
	d.mu.RLock()
	defer d.mu.RUnlock()
	n := 0
	for _, dn := range d.nodes {
		n += len(dn.volumes)
	}
	out := make([]Key, 0, n)
	for name, dn := range d.nodes {
		for vol := range dn.volumes {
			out = append(out, Key{Volume: vol, Node: name})
		}
	}
	return out
}

// Wants reports whether some pod wants the volume on the node of key; it
// is Get without building the Wanted.
func (d *Desired) Wants(key Key) bool {
	d.mu.RLock()
	defer d.mu.RUnlock()
	n := d.nodes[key.Node]
	return n != nil && n.volumes[key.Volume] != nil
}
