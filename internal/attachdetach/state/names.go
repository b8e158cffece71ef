package state

import (
	"crypto/sha256"
	"hash/fnv"
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
//
// Each name also keeps the version of its VolumeAttachment the key's last
// successful pass decided on (VersionOf), so that the informer's event of
// a version a pass already saw (our own create, read back through the
// overlay) wakes nothing: see Pass and Observe.
type Names struct {
	mu      sync.Mutex
	digests map[nameDigest]nameEntry
	others  map[string]nameEntry
	// passes holds, per name whose key has a pass running, the version of
	// the last VolumeAttachment event that came during the pass (0: none).
	passes map[string]uint64
}

// nameEntry is a name's key and the VolumeAttachment version its last
// successful pass decided on (0: none, or absent).
type nameEntry struct {
	key     Key
	decided uint64
}

// VersionOf identifies a VolumeAttachment version by its UID and
// resourceVersion; 0 means "no VolumeAttachment".
func VersionOf(uid, resourceVersion string) uint64 {
	if uid == "" && resourceVersion == "" {
		return 0
	}
	h := fnv.New64a()
	h.Write([]byte(uid))
	h.Write([]byte{0})
	h.Write([]byte(resourceVersion))
	return max(h.Sum64(), 1)
}

// nameDigest is the digest a controller-made VolumeAttachment name spells.
type nameDigest = [sha256.Size]byte

// digestOf returns the digest name spells when it has the form of the
// names the controller makes (kubenames.VolumeAttachmentNameDigest).
func digestOf(name string) (nameDigest, bool) { return kubenames.VolumeAttachmentNameDigest(name) }

// NewNames returns an empty index.
func NewNames() *Names {
	return &Names{digests: map[nameDigest]nameEntry{}, others: map[string]nameEntry{}, passes: map[string]uint64{}}
}

// Set records that the VolumeAttachment name belongs to key.
func (n *Names) Set(name string, key Key) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if d, ok := digestOf(name); ok {
		if e := n.digests[d]; e.key != key {
			n.digests[d] = nameEntry{key: key}
		}
		return
	}
	if e := n.others[name]; e.key != key {
		n.others[name] = nameEntry{key: key}
	}
}

// Pass notes that a pass of the key of name starts: until PassDone, an
// event of its VolumeAttachment is held back (Observe) and weighed against
// what the pass decided on.
func (n *Names) Pass(name string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.passes[name] = 0
}

// PassDone ends the pass of name. decided is the version of the
// VolumeAttachment the pass's last decision saw (VersionOf), ok whether
// the pass succeeded (a failed pass remembers nothing: the next event
// runs a pass). It reports whether an event that came during the pass
// brought a version the pass did not decide on: then the caller wakes
// the key.
func (n *Names) PassDone(name string, decided uint64, ok bool) (wake bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	pending := n.passes[name]
	delete(n.passes, name)
	if !ok {
		decided = 0
	}
	n.setDecidedLocked(name, decided)
	return pending != 0 && (!ok || pending != decided)
}

func (n *Names) setDecidedLocked(name string, decided uint64) {
	if d, ok := digestOf(name); ok {
		if e, found := n.digests[d]; found {
			e.decided = decided
			n.digests[d] = e
		}
		return
	}
	if e, found := n.others[name]; found {
		e.decided = decided
		n.others[name] = e
	}
}

// Observe looks up the key of the VolumeAttachment name for an event of
// its version (VersionOf) and reports whether the event needs a pass of
// the key: not when the key's last successful pass decided on that very
// version, nor while a pass runs (PassDone weighs the event then). known
// is false for a name the index does not hold.
func (n *Names) Observe(name string, version uint64) (key Key, known, wake bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	e, known := n.getLocked(name)
	if !known {
		return Key{}, false, false
	}
	if _, running := n.passes[name]; running {
		n.passes[name] = version
		return e.key, true, false
	}
	return e.key, true, e.decided != version
}

// ForgetIf drops name if it still maps to key and unused is true. The
// caller finds the key unused and makes it live again (an adopted
// VolumeAttachment: recorded in the actual state, then Set) under one
// lock of its own (the controller's volume lock), so no check runs under
// this index's lock.
func (n *Names) ForgetIf(name string, key Key, unused bool) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if e, ok := n.getLocked(name); !ok || e.key != key || !unused {
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
	e, ok := n.getLocked(name)
	return e.key, ok
}

// GetDigest is Get for a name of the controller's form, given as the
// digest it spells (kubenames.VolumeAttachmentNameDigest), for a caller
// that has parsed the name already.
func (n *Names) GetDigest(d [sha256.Size]byte) (Key, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	e, ok := n.digests[d]
	return e.key, ok
}

func (n *Names) getLocked(name string) (nameEntry, bool) {
	if d, ok := digestOf(name); ok {
		e, found := n.digests[d]
		return e, found
	}
	e, ok := n.others[name]
	return e, ok
}
