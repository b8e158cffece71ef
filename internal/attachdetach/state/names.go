package state

import (
	"crypto/sha256"
	"sync"

	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// Names indexes VolumeAttachment names by the key they belong to, so a
// VolumeAttachment event is routed without resolving its PV. Names are
// set whenever a key is reconciled or rebuilt, and dropped when a pass
// finds the key neither wanted nor attached and its VolumeAttachment gone
// (ForgetIf), so the index holds one name per live key rather than every
// name ever seen. A name the index does not know is resolved by the
// caller (the controller's VolumeAttachment queue).
//
// The names the controller makes ("csi-" and the hex SHA-256 of handle,
// driver and node) are kept as their 32-byte digest, in the map's own
// table: as strings, each would be a 68-byte allocation (80 with its size
// class) beside the map, one per attached volume. Any other name is kept
// as it is.
type Names struct {
	mu      sync.Mutex
	digests map[nameDigest]Key
	others  map[string]Key
}

// nameDigest is the digest a controller-made VolumeAttachment name spells.
type nameDigest = [sha256.Size]byte

// digestOf returns the digest name spells when it has the form of the
// names the controller makes (kubenames.VolumeAttachmentNameDigest).
func digestOf(name string) (nameDigest, bool) { return kubenames.VolumeAttachmentNameDigest(name) }

// NewNames returns an empty index.
func NewNames() *Names { return &Names{digests: map[nameDigest]Key{}, others: map[string]Key{}} }

// Set records that the VolumeAttachment name belongs to key.
func (n *Names) Set(name string, key Key) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if d, ok := digestOf(name); ok {
		n.digests[d] = key
		return
	}
	n.others[name] = key
}

// ForgetIf drops name if it still maps to key and unused reports true;
// unused runs under the index's lock. Whoever makes a key live again (an
// adopted VolumeAttachment) records it in the actual state before calling
// Set, so either unused sees the entry or Set comes after the drop.
func (n *Names) ForgetIf(name string, key Key, unused func() bool) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if k, ok := n.getLocked(name); !ok || k != key || !unused() {
		return false
	}
	if d, ok := digestOf(name); ok {
		delete(n.digests, d)
	} else {
		delete(n.others, name)
	}
	return true
}

// Len returns the number of names held.
func (n *Names) Len() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.digests) + len(n.others)
}

// Get returns the key of the VolumeAttachment name.
func (n *Names) Get(name string) (Key, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.getLocked(name)
}

// GetDigest is Get for a name of the controller's form, given as the
// digest it spells (kubenames.VolumeAttachmentNameDigest), for a caller
// that has parsed the name already.
func (n *Names) GetDigest(d [sha256.Size]byte) (Key, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	k, ok := n.digests[d]
	return k, ok
}

func (n *Names) getLocked(name string) (Key, bool) {
	if d, ok := digestOf(name); ok {
		k, found := n.digests[d]
		return k, found
	}
	k, ok := n.others[name]
	return k, ok
}
