package state

import "sync"

// Names indexes VolumeAttachment names by the key they belong to, so a
// VolumeAttachment event is routed without resolving its PV. Names are
// set whenever a key is reconciled or rebuilt, and dropped when a pass
// finds the key neither wanted nor attached and its VolumeAttachment gone
// (ForgetIf), so the index holds one name per live key rather than every
// name ever seen. A name the index does not know is resolved by the
// caller (the controller's VolumeAttachment queue).
type Names struct {
	mu    sync.Mutex
	names map[string]Key
}

// NewNames returns an empty index.
func NewNames() *Names { return &Names{names: map[string]Key{}} }

// Set records that the VolumeAttachment name belongs to key.
func (n *Names) Set(name string, key Key) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.names[name] = key
}

// ForgetIf drops name if it still maps to key and unused reports true;
// unused runs under the index's lock. Whoever makes a key live again (an
// adopted VolumeAttachment) records it in the actual state before calling
// Set, so either unused sees the entry or Set comes after the drop.
func (n *Names) ForgetIf(name string, key Key, unused func() bool) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if k, ok := n.names[name]; !ok || k != key || !unused() {
		return false
	}
	delete(n.names, name)
	return true
}

// Len returns the number of names held.
func (n *Names) Len() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.names)
}

// Get returns the key of the VolumeAttachment name.
func (n *Names) Get(name string) (Key, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	k, ok := n.names[name]
	return k, ok
}
