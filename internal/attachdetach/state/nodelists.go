package state

import (
	"strconv"

	v1 "k8s.io/api/core/v1"
)

// nodeLists is what each Node's status.volumesAttached holds on the API
// server, so that a VolumeAttachment is deleted only once the kubelet can
// no longer see its volume as attached. It is part of Actual and guarded
// by Actual's lock: the entries that say what a node's list should be and
// the lists written or being written are one state with one owner.
//
// The controller is the only writer of status.volumesAttached, so after a
// successful write the server holds exactly what was written; before the
// first write of this process, the informer's view is the truth.
//
// The lost-update race it closes: the node status worker computes its
// list from the entries and writes it some milliseconds later. If a
// detach stopped reporting the volume in between, the write would put it
// back after the VolumeAttachment was deleted. So taking the entries and
// marking the list in flight is one step (BeginNodeStatusWrite), and
// NodeStatusMayList counts in-flight writes: a detach decided after the
// entry stopped reporting the volume either finds the write that still
// lists it in flight (and waits for the next one) or finds it done.
type nodeLists struct {
	// written is the list of the last successful write per node.
	written map[string]map[v1.UniqueVolumeName]struct{}
	// rv is the resourceVersion that write gave the Node. While the
	// informer shows an older Node, its status.volumesAttached predates
	// the write and says nothing about the server: comparing with it
	// would write the same list again.
	rv map[string]int64
	// inflight is, per node with a write in progress, the volumes of
	// entries it lists.
	inflight map[string]map[v1.UniqueVolumeName]struct{}
	// gone marks nodes whose Node object does not exist: nothing is
	// listed there.
	gone map[string]bool
}

func newNodeLists() nodeLists {
	return nodeLists{
		written:  map[string]map[v1.UniqueVolumeName]struct{}{},
		rv:       map[string]int64{},
		inflight: map[string]map[v1.UniqueVolumeName]struct{}{},
		gone:     map[string]bool{},
	}
}

// VolumeSet returns the names of list as a set.
func VolumeSet(list []v1.AttachedVolume) map[v1.UniqueVolumeName]struct{} {
	s := make(map[v1.UniqueVolumeName]struct{}, len(list))
	for _, av := range list {
		s[av.Name] = struct{}{}
	}
	return s
}

// BeginNodeStatusWrite returns the entries on node, sorted by volume, and
// marks the volumes of those reported in node status as a write in
// flight: the caller computes the node's list from them and writes it,
// then calls FinishNodeStatusWrite.
func (a *Actual) BeginNodeStatusWrite(node string) []Attachment {
	a.mu.Lock()
	defer a.mu.Unlock()
	entries := a.forNodeLocked(node)
	reported := map[v1.UniqueVolumeName]struct{}{}
	for _, e := range entries {
		if e.ReportedInNodeStatus {
			reported[e.Volume] = struct{}{}
		}
	}
	a.lists.inflight[node] = reported
	return entries
}

// FinishNodeStatusWrite records the end of a write to node; list is what
// the server now holds (nil with ok=false when the write failed or was
// not sent) and rv the Node's resourceVersion that holds it.
func (a *Actual) FinishNodeStatusWrite(node string, list []v1.AttachedVolume, ok bool, rv string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.lists.inflight, node)
	if ok {
		a.lists.written[node] = VolumeSet(list)
		a.lists.rv[node], _ = strconv.ParseInt(rv, 10, 64)
		delete(a.lists.gone, node)
	}
}

// NodeStatusInformerBehind reports whether the informer's Node, at
// resourceVersion rv, is older than the last write to node. The API
// server's resourceVersions are etcd revisions, which grow with every
// write; the kube-scheduler's assume cache orders them the same way. A
// resourceVersion that is not a number makes this false: the informer is
// trusted, and at worst a list is written twice.
func (a *Actual) NodeStatusInformerBehind(node, rv string) bool {
	a.mu.RLock()
	defer a.mu.RUnlock()
	n, err := strconv.ParseInt(rv, 10, 64)
	return err == nil && n < a.lists.rv[node]
}

// NodeStatusGone records that the Node object does not exist: its status
// lists nothing.
func (a *Actual) NodeStatusGone(node string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.lists.written, node)
	delete(a.lists.rv, node)
	a.lists.gone[node] = true
}

// ForgetNodeStatus drops what is known of a deleted node's status once
// the node has no entry left and no write in flight, so that the actual
// state does not keep every node name the cluster ever had. Without a
// record, NodeStatusMayList asks the informer, which lists nothing for a
// node it does not have: the same answer as gone.
func (a *Actual) ForgetNodeStatus(node string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, writing := a.lists.inflight[node]; writing || len(a.byNode[node]) > 0 {
		return
	}
	delete(a.lists.gone, node)
	delete(a.lists.written, node)
	delete(a.lists.rv, node)
}

// NodeStatusSeen records that the Node object exists (again).
func (a *Actual) NodeStatusSeen(node string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.lists.gone, node)
}

// LastNodeStatusWrite returns the list of the last successful write to
// node and whether there was one.
func (a *Actual) LastNodeStatusWrite(node string) (map[v1.UniqueVolumeName]struct{}, bool) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	s, ok := a.lists.written[node]
	return s, ok
}

// NodeStatusMayList reports whether node's status.volumesAttached on the
// API server may still list vol: the last write lists it, a write in
// flight does, or, before any write, informer (the informer's Node's
// list) does. A node known gone lists nothing. This is
// decide.Input.NodeStatusMayList.
func (a *Actual) NodeStatusMayList(node string, vol v1.UniqueVolumeName, informer []v1.AttachedVolume) bool {
	a.mu.RLock()
	defer a.mu.RUnlock()
	if a.lists.gone[node] {
		return false
	}
	if _, ok := a.lists.inflight[node][vol]; ok {
		return true
	}
	if w, ok := a.lists.written[node]; ok {
		_, listed := w[vol]
		return listed
	}
	_, listed := VolumeSet(informer)[vol]
	return listed
}

// NodeStatusWritten reports whether vol is in node's last written or
// in-flight volumesAttached (decide.NodeListing.Written).
func (a *Actual) NodeStatusWritten(node string, vol v1.UniqueVolumeName) bool {
	a.mu.RLock()
	defer a.mu.RUnlock()
	_, inflight := a.lists.inflight[node][vol]
	_, written := a.lists.written[node][vol]
	return inflight || written
}
