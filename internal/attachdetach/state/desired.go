// Package state holds the attach/detach controller's two caches: the
// desired state of the world (which pods want which CSI volume on which
// node) and the actual state of the world (what is attached where, as far
// as the controller knows).
//
// Both are keyed by Key (unique volume name + node). Every mutator returns
// the keys whose facts it changed, so the event-driven caller enqueues
// exactly those; callers must also enqueue every key of the same volume
// when a key changes, because the decision for one node depends on the
// volume's other nodes (multi-attach).
//
// The caches are safe for concurrent use (workers and informer handlers
// share them) and never call out: no clients, no clocks, no goroutines.
// Values returned are copies; the caches never hand out internal pointers.
package state

import (
	"cmp"
	"slices"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/latchcsi/latch/internal/attachdetach/volume"
)

// Key identifies one volume on one node, the unit of reconciliation.
type Key struct {
	Volume v1.UniqueVolumeName
	Node   string
}

func (k Key) String() string { return string(k.Volume) + "@" + k.Node }

// PodRef identifies a pod; events are recorded against it.
type PodRef struct {
	Namespace string
	Name      string
	UID       types.UID
}

// PodRefOf returns the PodRef of pod.
func PodRefOf(pod *v1.Pod) PodRef {
	return PodRef{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}
}

// Wanted is a volume to attach to a node and the pods that want it there.
type Wanted struct {
	// Volume is the spec the latest pod was added with; it is the one
	// the VolumeAttachment is created from.
	Volume volume.Attachable
	// Specs are the distinct specs the pods resolved the volume to (two
	// PVs, or a PV and an inline spec, can name one volume handle),
	// sorted by SpecName and access modes. Multi-attach looks at all of
	// them: one exclusive spec makes the volume exclusive.
	Specs []volume.Attachable
	// Pods is sorted by namespace, name, UID.
	Pods []PodRef
}

// Desired is the desired state of the world.
type Desired struct {
	mu sync.RWMutex
	// nodes holds every node the caller told about; only managed nodes
	// hold volumes.
	nodes map[string]*desiredNode
	// volumeNodes indexes nodes by volume for NodesWantingVolume.
	volumeNodes smallSets[v1.UniqueVolumeName, string]
	// pods remembers what each pod was added with, so DeletePod and a
	// re-AddPod know what to remove.
	pods map[types.UID]*desiredPod
}

type desiredNode struct {
	managed bool
	volumes map[v1.UniqueVolumeName]*desiredVolume
}

type desiredVolume struct {
	// spec is the latest resolution any pod was added with. It and the
	// users' specs point to copies AddPod made, which nothing writes to:
	// a volume wanted by one pod (almost every one) holds its resolution
	// once, not twice (an Attachable is about 140 bytes).
	spec *volume.Attachable
	// users are the pods that want the volume on the node, each with its
	// resolution (see Wanted.Specs), in no order. A slice, not a map:
	// almost every volume has one pod, and a map's smallest table holds
	// eight entries.
	users []volumeUser
}

// volumeUser is one pod that wants a volume on a node.
type volumeUser struct {
	pod  PodRef
	spec *volume.Attachable
}

// add records spec as one of pod's resolutions of the volume (a pod
// names it once, or through several specs: see AddPod) and makes it the
// volume's spec unless pod already gave a more restrictive one. The
// caller has removed what pod had before.
func (dv *desiredVolume) add(pod PodRef, spec *volume.Attachable) {
	for _, u := range dv.users {
		if u.pod.UID == pod.UID && volume.SameSpec(*u.spec, *spec) {
			return
		}
	}
	ownSpec := slices.ContainsFunc(dv.users, func(u volumeUser) bool { return u.pod.UID == pod.UID && u.spec == dv.spec })
	if !ownSpec || (dv.spec.MultiAttachAllowed() && !spec.MultiAttachAllowed()) {
		dv.spec = spec
	}
	dv.users = append(dv.users, volumeUser{pod: pod, spec: spec})
}

// remove forgets the pod uid (every resolution of it) and reports whether
// any pod is left.
func (dv *desiredVolume) remove(uid types.UID) (left bool) {
	for i := 0; i < len(dv.users); {
		if dv.users[i].pod.UID != uid {
			i++
			continue
		}
		last := len(dv.users) - 1
		dv.users[i] = dv.users[last]
		dv.users[last] = volumeUser{}
		dv.users = dv.users[:last]
	}
	return len(dv.users) > 0
}

type desiredPod struct {
	ref     PodRef
	node    string
	volumes []v1.UniqueVolumeName
	// reported holds the event dedupe keys already emitted for this pod;
	// it dies with the pod, so a new pod gets its own events.
	reported map[string]struct{}
}

// NewDesired returns an empty desired state.
func NewDesired() *Desired {
	return &Desired{
		nodes:       map[string]*desiredNode{},
		volumeNodes: smallSets[v1.UniqueVolumeName, string]{},
		pods:        map[types.UID]*desiredPod{},
	}
}

// AddNode records a node and whether its volumes are controller-managed
// (annotation volumes.kubernetes.io/controller-managed-attach-detach).
// A node that stops being managed loses its wanted volumes: the kubelet
// owns them from then on. Returns the keys that stopped being wanted.
func (d *Desired) AddNode(name string, managed bool) []Key {
	d.mu.Lock()
	defer d.mu.Unlock()
	n, ok := d.nodes[name]
	if !ok {
		d.nodes[name] = &desiredNode{managed: managed, volumes: map[v1.UniqueVolumeName]*desiredVolume{}}
		return nil
	}
	n.managed = managed
	if managed {
		return nil
	}
	return d.dropNodeVolumesLocked(name, n)
}

// DeleteNode forgets a node; every volume wanted there stops being wanted
// (the pods cannot run on a node that does not exist). Returns those keys.
func (d *Desired) DeleteNode(name string) []Key {
	d.mu.Lock()
	defer d.mu.Unlock()
	n, ok := d.nodes[name]
	if !ok {
		return nil
	}
	keys := d.dropNodeVolumesLocked(name, n)
	delete(d.nodes, name)
	return keys
}

func (d *Desired) dropNodeVolumesLocked(name string, n *desiredNode) []Key {
	var keys []Key
	for vol, dv := range n.volumes {
		keys = append(keys, Key{Volume: vol, Node: name})
		for _, u := range dv.users {
			delete(d.pods, u.pod.UID)
		}
		d.unindexLocked(vol, name)
	}
	clear(n.volumes)
	sortKeys(keys)
	return keys
}

// NodeManaged reports whether the node is known and managed.
func (d *Desired) NodeManaged(name string) bool {
	d.mu.RLock()
	defer d.mu.RUnlock()
	n, ok := d.nodes[name]
	return ok && n.managed
}

// AddPod sets the volumes pod wants on node, replacing what it was added
// with before (a PVC may have become bound, a pod may have terminated:
// pass nil vols). ok is false when node is not a known managed node: the
// pod is then not recorded and the caller retries when the node appears.
// Returns the keys whose pod set changed.
//
// vols may name one unique volume through several specs (two PVs of one
// volume handle): each is kept (Wanted.Specs), in any order, and the
// volume's spec (Wanted.Volume) is the pod's first exclusive one if it
// has one, else its first: the most restrictive access wins, whatever
// the order of the pod's volumes.
func (d *Desired) AddPod(pod PodRef, node string, vols []volume.Attachable) (changed []Key, ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	n, known := d.nodes[node]
	if !known || !n.managed {
		return d.deletePodLocked(pod.UID), false
	}
	prev := d.pods[pod.UID]
	var reported map[string]struct{}
	if prev != nil && prev.node == node {
		reported = prev.reported
	}
	changed = d.deletePodLocked(pod.UID)
	if len(vols) == 0 {
		// Terminated pods are re-added with no volumes.
		return changed, true
	}
	p := &desiredPod{ref: pod, node: node, reported: reported}
	for _, a := range vols {
		dv, exists := n.volumes[a.UniqueName]
		if !exists {
			dv = &desiredVolume{}
			n.volumes[a.UniqueName] = dv
			d.indexLocked(a.UniqueName, node)
		}
		spec := new(volume.Attachable)
		*spec = a
		dv.add(pod, spec)
		if !slices.Contains(p.volumes, a.UniqueName) {
			p.volumes = append(p.volumes, a.UniqueName)
		}
		changed = append(changed, Key{Volume: a.UniqueName, Node: node})
	}
	d.pods[pod.UID] = p
	return dedupKeys(changed), true
}

// DeletePod removes a pod from the desired state. Returns the keys whose
// pod set changed.
func (d *Desired) DeletePod(uid types.UID) []Key {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.deletePodLocked(uid)
}

func (d *Desired) deletePodLocked(uid types.UID) []Key {
	p, ok := d.pods[uid]
	if !ok {
		return nil
	}
	delete(d.pods, uid)
	n := d.nodes[p.node]
	var keys []Key
	for _, vol := range p.volumes {
		keys = append(keys, Key{Volume: vol, Node: p.node})
		if n == nil {
			continue
		}
		dv := n.volumes[vol]
		if dv == nil {
			continue
		}
		if !dv.remove(uid) {
			delete(n.volumes, vol)
			d.unindexLocked(vol, p.node)
		}
	}
	return dedupKeys(keys)
}

func (d *Desired) indexLocked(vol v1.UniqueVolumeName, node string) {
	d.volumeNodes.add(vol, node)
}

func (d *Desired) unindexLocked(vol v1.UniqueVolumeName, node string) {
	d.volumeNodes.del(vol, node)
}

// Get returns the volume wanted at key and its pods; ok is false when no
// pod wants it there.
func (d *Desired) Get(key Key) (Wanted, bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	n := d.nodes[key.Node]
	if n == nil {
		return Wanted{}, false
	}
	dv := n.volumes[key.Volume]
	if dv == nil {
		return Wanted{}, false
	}
	return dv.wanted(), true
}

func (dv *desiredVolume) wanted() Wanted {
	specs := make([]volume.Attachable, len(dv.users))
	pods := make([]PodRef, len(dv.users))
	for i, u := range dv.users {
		specs[i], pods[i] = *u.spec, u.pod
	}
	// A pod that names the volume through several specs is one user.
	return Wanted{Volume: *dv.spec, Specs: distinctSpecs(specs), Pods: slices.Compact(sortPods(pods))}
}

// distinctSpecs sorts out by SpecName and access modes and returns it
// without repeats. Specs that differ in neither are the same for
// multi-attach; the first in that order is kept.
func distinctSpecs(out []volume.Attachable) []volume.Attachable {
	order := func(a, b volume.Attachable) int {
		return cmp.Or(cmp.Compare(a.SpecName, b.SpecName), slices.Compare(a.AccessModes, b.AccessModes))
	}
	slices.SortFunc(out, func(a, b volume.Attachable) int {
		return cmp.Or(order(a, b), cmp.Compare(a.PVName, b.PVName))
	})
	return slices.CompactFunc(out, func(a, b volume.Attachable) bool { return order(a, b) == 0 })
}

// VolumesOnNode returns the volumes wanted on node, sorted by name.
func (d *Desired) VolumesOnNode(node string) []Wanted {
	d.mu.RLock()
	defer d.mu.RUnlock()
	n := d.nodes[node]
	if n == nil {
		return nil
	}
	out := make([]Wanted, 0, len(n.volumes))
	for _, dv := range n.volumes {
		out = append(out, dv.wanted())
	}
	slices.SortFunc(out, func(a, b Wanted) int { return cmp.Compare(a.Volume.UniqueName, b.Volume.UniqueName) })
	return out
}

// PodsWantingVolume returns the pods that want vol on node, sorted.
func (d *Desired) PodsWantingVolume(vol v1.UniqueVolumeName, node string) []PodRef {
	w, _ := d.Get(Key{Volume: vol, Node: node})
	return w.Pods
}

// NodesWantingVolume returns the nodes where some pod wants vol, sorted.
func (d *Desired) NodesWantingVolume(vol v1.UniqueVolumeName) []string {
	d.mu.RLock()
	defer d.mu.RUnlock()
	out := slices.Clone(d.volumeNodes[vol])
	slices.Sort(out)
	return out
}

// MarkReported records that the event with dedupeKey was emitted for the
// pod and reports whether this is the first time, so the executor emits
// each event once per pod. Unknown pods return false: they no longer want
// anything, so there is nobody to tell.
func (d *Desired) MarkReported(uid types.UID, dedupeKey string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	p := d.pods[uid]
	if p == nil {
		return false
	}
	if _, done := p.reported[dedupeKey]; done {
		return false
	}
	if p.reported == nil {
		p.reported = map[string]struct{}{}
	}
	p.reported[dedupeKey] = struct{}{}
	return true
}

func sortPods(out []PodRef) []PodRef {
	slices.SortFunc(out, ComparePods)
	return out
}

// ComparePods orders pods by namespace, name, UID.
func ComparePods(a, b PodRef) int {
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name), cmp.Compare(a.UID, b.UID))
}

func compareKeys(a, b Key) int {
	return cmp.Or(cmp.Compare(a.Volume, b.Volume), cmp.Compare(a.Node, b.Node))
}

func sortKeys(keys []Key) { slices.SortFunc(keys, compareKeys) }

func dedupKeys(keys []Key) []Key {
	sortKeys(keys)
	return slices.Compact(keys)
}
