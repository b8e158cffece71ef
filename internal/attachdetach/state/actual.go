package state

import (
	"cmp"
	"fmt"
	"iter"
	"maps"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/latchcsi/latch/internal/attachdetach/volume"
)

// AttachState is what the controller believes about a volume on a node.
type AttachState int

const (
	// StateUncertain: a VolumeAttachment exists (or may exist) but the
	// controller does not know whether the volume is attached, e.g. a VA
	// found at start that nothing else explains. Counts as attached for
	// multi-attach and is detached when nothing wants it.
	StateUncertain AttachState = iota + 1
	// StateAttaching: the controller created the VolumeAttachment and
	// waits for status.attached.
	StateAttaching
	// StateAttached: status.attached is true (or Node.status said so at
	// start).
	StateAttached
	// StateDetaching: the VolumeAttachment is being deleted.
	StateDetaching
)

var stateNames = [...]string{"", "Uncertain", "Attaching", "Attached", "Detaching"}

func (s AttachState) String() string {
	if s > 0 && int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("AttachState(%d)", int(s))
}

// Attachment is one ASW entry.
type Attachment struct {
	Key
	// Spec is the attached volume; nil for entries rebuilt from
	// Node.status alone until a VA or a pod tells more. The VA name can
	// always be derived from Key.Volume (volume.AttachmentNameFor).
	Spec  *volume.Attachable
	State AttachState
	// ReportedInNodeStatus says the volume belongs in the node's
	// status.volumesAttached: the kubelet may mount it. It is cleared
	// before a detach starts and only set once the volume is attached.
	ReportedInNodeStatus bool
	// MountedByNode says the node lists the volume in status.volumesInUse,
	// or the controller has not seen a node status since the entry was
	// created (assume mounted until proven otherwise, as upstream does).
	MountedByNode bool
	// DetachRequestedAt is when the controller first found the volume no
	// longer wanted on the node; the unmount timeout counts from there.
	// Zero while it is wanted.
	DetachRequestedAt time.Time
}

// Update is the part of an entry a reconcile decision owns. Apply sets
// these fields and leaves observations (MountedByNode) alone, so a
// decision made on a slightly older snapshot cannot undo a node update.
type Update struct {
	// Remove forgets the entry: the VolumeAttachment is gone.
	Remove               bool
	State                AttachState
	ReportedInNodeStatus bool
	DetachRequestedAt    time.Time
	// Spec, when non-nil, replaces the entry's spec.
	Spec *volume.Attachable
}

// Actual is the actual state of the world, and what each node's
// status.volumesAttached holds (nodelists.go). One lock guards both; no
// method calls out of the package while holding it.
type Actual struct {
	mu      sync.RWMutex
	entries map[Key]*Attachment
	// byVolume and byNode index entries for multi-attach and node status.
	byVolume smallSets[v1.UniqueVolumeName, string]
	byNode   map[string]map[v1.UniqueVolumeName]struct{}
	// inUse is the last status.volumesInUse seen per node, plus volumes
	// attached since (assumed mounted). Kept after the node is deleted:
	// the last word from a vanished node is all there is.
	inUse map[string]map[v1.UniqueVolumeName]struct{}
	// deletedNodes drop their inUse set once their last entry goes.
	deletedNodes map[string]struct{}
	// lists is what each node's status.volumesAttached holds or is being
	// written with (nodelists.go).
	lists nodeLists
}

// NewActual returns an empty actual state.
func NewActual() *Actual {
	return &Actual{
		entries:      map[Key]*Attachment{},
		byVolume:     smallSets[v1.UniqueVolumeName, string]{},
		byNode:       map[string]map[v1.UniqueVolumeName]struct{}{},
		inUse:        map[string]map[v1.UniqueVolumeName]struct{}{},
		deletedNodes: map[string]struct{}{},
		lists:        newNodeLists(),
	}
}

// Get returns the entry for key.
func (a *Actual) Get(key Key) (Attachment, bool) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	e, ok := a.entries[key]
	if !ok {
		return Attachment{}, false
	}
	return a.viewLocked(e), true
}

// ForVolume returns the entries of vol on every node, sorted by node.
func (a *Actual) ForVolume(vol v1.UniqueVolumeName) []Attachment {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return sortedViewsLocked(a, slices.Values(a.byVolume[vol]),
		func(node string) Key { return Key{Volume: vol, Node: node} },
		func(x Attachment) string { return x.Node })
}

// ForNode returns the entries on node, sorted by volume.
func (a *Actual) ForNode(node string) []Attachment {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.forNodeLocked(node)
}

func (a *Actual) forNodeLocked(node string) []Attachment {
	return sortedViewsLocked(a, maps.Keys(a.byNode[node]),
		func(vol v1.UniqueVolumeName) Key { return Key{Volume: vol, Node: node} },
		func(x Attachment) string { return string(x.Volume) })
}

// sortedViewsLocked returns the views of the entries of the members of
// one index set (key makes a member's Key), sorted by sortKey.
func sortedViewsLocked[M comparable](a *Actual, set iter.Seq[M], key func(M) Key, sortKey func(Attachment) string) []Attachment {
	var out []Attachment
	for m := range set {
		out = append(out, a.viewLocked(a.entries[key(m)]))
	}
	slices.SortFunc(out, func(x, y Attachment) int { return cmp.Compare(sortKey(x), sortKey(y)) })
	return out
}

// StateOf returns key's AttachState, and whether the actual state has the
// key, without copying its entry: the verify pass reads nothing else, for
// every key once per period.
func (a *Actual) StateOf(key Key) (AttachState, bool) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	e, ok := a.entries[key]
	if !ok {
		return 0, false
	}
	return e.State, true
}

// KeysAnyOrder is Keys without the sort, for callers that visit every
// key and need no order (the verify pass: sorting 100,000 keys was an
// eighth of its time).
func (a *Actual) KeysAnyOrder() []Key {
	a.mu.RLock()
	defer a.mu.RUnlock()
	out := make([]Key, 0, len(a.entries))
	for k := range a.entries {
		out = append(out, k)
	}
	return out
}

// Keys returns every key, sorted; for periodic safety resyncs.
func (a *Actual) Keys() []Key {
	out := a.KeysAnyOrder()
	sortKeys(out)
	return out
}

func (a *Actual) viewLocked(e *Attachment) Attachment {
	v := *e
	if e.Spec != nil {
		s := *e.Spec
		v.Spec = &s
	}
	_, v.MountedByNode = a.inUse[e.Node][e.Volume]
	return v
}

// Apply records a reconcile decision for key. It reports whether the
// entry changed (callers then enqueue the volume's other keys and, when
// ReportedInNodeStatus changed, the node's status).
func (a *Actual) Apply(key Key, u Update) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	e, ok := a.entries[key]
	if u.Remove {
		if !ok {
			return false
		}
		a.removeLocked(key)
		return true
	}
	if !ok {
		e = &Attachment{Key: key}
		a.insertLocked(e)
		a.assumeMountedLocked(key)
	}
	before := *e
	e.State = u.State
	e.ReportedInNodeStatus = u.ReportedInNodeStatus
	e.DetachRequestedAt = u.DetachRequestedAt
	if u.Spec != nil {
		s := *u.Spec
		e.Spec = &s
	}
	return !ok || before.State != e.State || before.ReportedInNodeStatus != e.ReportedInNodeStatus ||
		!before.DetachRequestedAt.Equal(e.DetachRequestedAt) || u.Spec != nil && (before.Spec == nil ||
		before.Spec.MultiAttachAllowed() != e.Spec.MultiAttachAllowed())
}

func (a *Actual) insertLocked(e *Attachment) {
	a.entries[e.Key] = e
	a.byVolume.add(e.Volume, e.Node)
	addIndex(a.byNode, e.Node, e.Volume)
}

func (a *Actual) removeLocked(key Key) {
	delete(a.entries, key)
	a.byVolume.del(key.Volume, key.Node)
	delIndex(a.byNode, key.Node, key.Volume)
	if _, gone := a.deletedNodes[key.Node]; gone && len(a.byNode[key.Node]) == 0 {
		delete(a.inUse, key.Node)
		delete(a.deletedNodes, key.Node)
	}
}

// assumeMountedLocked marks a new attachment mounted until the node's next
// status says otherwise: the kubelet may already be mounting it and the
// controller may not have seen its volumesInUse yet (upstream does the
// same in AddVolumeNode).
func (a *Actual) assumeMountedLocked(key Key) {
	addIndex(a.inUse, key.Node, key.Volume)
}

// SetVolumesInUse records a node's status.volumesInUse and returns the
// keys whose MountedByNode changed.
func (a *Actual) SetVolumesInUse(node string, inUse []v1.UniqueVolumeName) []Key {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.deletedNodes, node)
	next := make(map[v1.UniqueVolumeName]struct{}, len(inUse))
	for _, v := range inUse {
		next[v] = struct{}{}
	}
	prev := a.inUse[node]
	a.inUse[node] = next
	var changed []Key
	for vol := range a.byNode[node] {
		_, was := prev[vol]
		_, is := next[vol]
		if was != is {
			changed = append(changed, Key{Volume: vol, Node: node})
		}
	}
	sortKeys(changed)
	return changed
}

// DeleteNode notes that the node object is gone. Entries stay (their
// VolumeAttachments still exist and must be detached); the node's last
// volumesInUse stays too, so a volume it was using is only detached after
// the unmount timeout, exactly as for a NotReady node.
func (a *Actual) DeleteNode(node string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.byNode[node]) == 0 {
		delete(a.inUse, node)
		return
	}
	a.deletedNodes[node] = struct{}{}
}

// smallSets indexes small sets of values by key, each set a slice in no
// order: a volume is attached to one node, rarely a few, and a map's
// smallest table holds eight entries.
type smallSets[K, V comparable] map[K][]V

func (m smallSets[K, V]) add(k K, v V) {
	if s := m[k]; !slices.Contains(s, v) {
		m[k] = append(s, v)
	}
}

func (m smallSets[K, V]) del(k K, v V) {
	s := m[k]
	i := slices.Index(s, v)
	if i < 0 {
		return
	}
	last := len(s) - 1
	var zero V
	s[i], s[last] = s[last], zero
	if last == 0 {
		delete(m, k)
		return
	}
	m[k] = s[:last]
}

func addIndex[K, V comparable](m map[K]map[V]struct{}, k K, v V) {
	s := m[k]
	if s == nil {
		s = map[V]struct{}{}
		m[k] = s
	}
	s[v] = struct{}{}
}

func delIndex[K, V comparable](m map[K]map[V]struct{}, k K, v V) {
	s := m[k]
	delete(s, v)
	if len(s) == 0 {
		delete(m, k)
	}
}
