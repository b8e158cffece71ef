package nodestatus

import (
	"strconv"
	"sync"

	v1 "k8s.io/api/core/v1"
)

// Book knows what each Node's status.volumesAttached holds on the
// API server, so that a VolumeAttachment is deleted only once the kubelet
// can no longer see its volume as attached.
//
// The controller is the only writer of status.volumesAttached, so after a
// successful write the server holds exactly what was written; before the
// first write of this process, the informer's view is the truth.
//
// The lost-update race it closes: the node status worker computes its list
// from a snapshot of the actual state and writes it some milliseconds
// later. If a detach removed the volume from the actual state in between,
// the write would put it back after the VolumeAttachment was deleted. So
// the snapshot and the "in flight" mark happen under one lock (Snapshot),
// a detach changes the actual state and checks Listed under the same lock
// (ApplyAndCheck), and Listed counts in-flight writes: either the snapshot
// was taken after the detach (it excludes the volume) or the detach sees
// the volume in flight and waits for the next write.
type Book struct {
	mu sync.Mutex
	// written is the list of the last successful write per node.
	written map[string]map[v1.UniqueVolumeName]struct{}
	// rv is the resourceVersion that write gave the Node. While the
	// informer shows an older Node, its status.volumesAttached predates
	// the write and says nothing about the server: comparing with it
	// would write the same list again.
	rv map[string]int64
	// inflight is the list of a write in progress per node.
	inflight map[string]map[v1.UniqueVolumeName]struct{}
	// gone marks nodes whose Node object does not exist: nothing is
	// listed there.
	gone map[string]bool
}

// NewBook returns an empty book.
func NewBook() *Book {
	return &Book{
		written:  map[string]map[v1.UniqueVolumeName]struct{}{},
		rv:       map[string]int64{},
		inflight: map[string]map[v1.UniqueVolumeName]struct{}{},
		gone:     map[string]bool{},
	}
}

// ToSet returns the names of list as a set.
func ToSet(list []v1.AttachedVolume) map[v1.UniqueVolumeName]struct{} {
	s := make(map[v1.UniqueVolumeName]struct{}, len(list))
	for _, av := range list {
		s[av.Name] = struct{}{}
	}
	return s
}

// Snapshot runs compute under the lock and marks its result in flight.
func (b *Book) Snapshot(node string, compute func() []v1.AttachedVolume) []v1.AttachedVolume {
	b.mu.Lock()
	defer b.mu.Unlock()
	want := compute()
	b.inflight[node] = ToSet(want)
	return want
}

// Finish records the end of a write; list is what the server now holds
// (nil with ok=false when the write failed) and rv the Node's
// resourceVersion that holds it.
func (b *Book) Finish(node string, list []v1.AttachedVolume, ok bool, rv string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.inflight, node)
	if ok {
		b.written[node] = ToSet(list)
		b.rv[node], _ = strconv.ParseInt(rv, 10, 64)
		delete(b.gone, node)
	}
}

// InformerBehind reports whether the informer's Node, at resourceVersion
// rv, is older than the last write to node. The API server's
// resourceVersions are etcd revisions, which grow with every write; the
// kube-scheduler's assume cache orders them the same way. A
// resourceVersion that is not a number makes this false: the informer is
// trusted, and at worst a list is written twice.
func (b *Book) InformerBehind(node, rv string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	n, err := strconv.ParseInt(rv, 10, 64)
	return err == nil && n < b.rv[node]
}

// NodeGone records that the Node object does not exist.
func (b *Book) NodeGone(node string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.written, node)
	delete(b.rv, node)
	b.gone[node] = true
}

// ForgetNode drops what the book knows about a deleted node once nothing
// of the node is left in the actual state and the informer no longer has
// the node either, so that the book does not keep every node name the
// cluster ever had. Without an entry, ApplyAndCheck asks the informer,
// which lists nothing for a node it does not have: the same answer as
// gone.
func (b *Book) ForgetNode(node string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, writing := b.inflight[node]; writing {
		return
	}
	delete(b.gone, node)
	delete(b.written, node)
	delete(b.rv, node)
}

// NodeSeen records that the Node object exists (again).
func (b *Book) NodeSeen(node string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.gone, node)
}

// LastWritten returns the last written list and whether there was one.
func (b *Book) LastWritten(node string) (map[v1.UniqueVolumeName]struct{}, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, ok := b.written[node]
	return s, ok
}

// ApplyAndCheck runs apply (an actual state change) under the lock and
// reports whether vol may still be listed in node's volumesAttached: in
// the last write, in a write in flight, or (before any write) in the
// informer's node status informer.
func (b *Book) ApplyAndCheck(node string, vol v1.UniqueVolumeName, apply func(), informer func() []v1.AttachedVolume) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	apply()
	if b.gone[node] {
		return false
	}
	if _, ok := b.inflight[node][vol]; ok {
		return true
	}
	if w, ok := b.written[node]; ok {
		_, listed := w[vol]
		return listed
	}
	_, listed := ToSet(informer())[vol]
	return listed
}

// MayBeListed reports whether vol is in node's last written or in-flight
// volumesAttached.
func (b *Book) MayBeListed(node string, vol v1.UniqueVolumeName) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, inflight := b.inflight[node][vol]
	_, written := b.written[node][vol]
	return inflight || written
}
