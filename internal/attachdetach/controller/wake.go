package controller

import (
	"context"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/component-base/metrics"

	"github.com/latchcsi/latch/internal/attachdetach/decide"
	"github.com/latchcsi/latch/internal/attachdetach/state"
	"github.com/latchcsi/latch/internal/runner"
)

// wake owns the controller's four queues and every wake-up: no other
// code calls Enqueue. Each method is named for what changed; this file is
// the whole queue graph.
//
//	  Pod events ──(the handler records the Pod: recordPod)──┐ Volumes
//	        PVC / PV / CSIDriver / Node-now-managed events     │
//	                      │ PodsBy, PodsOfDriver                │
//	                      ▼                                     ▼
//	                   [pods] ──Volumes──▶ [keys] ◀── Node (NodeKeys, Keys), CSINode
//	                                       ▲ │  ▲     (MigrationKeys), VA of a version
//	  VA, unknown name                     │ │  │     no pass decided on
//	  (VolumeAttachment) ──▶ [vas] ─Volumes┘ │  │     (VolumeAttachmentChanged), verify
//	                      (adopt)      Plan: │  │ Detaching
//	                                NodeStatus  │ (after every pass)
//	  Node volumesAttached ──NodeStatus──▶   ▼  │
//	                                  [node status]
//
//	queue        item             woken by (method ← source)                      its pass wakes
//	pods         "ns/name"        PodsBy ← PVC, PV, managed Node; PodsOfDriver    Volumes
//	                              ← CSIDriver; Pod ← a failed recording, held
//	                              Pod events after the rebuild (releaseHeld)
//	keys         (volume, node)   Volumes ← Pod recording, pods, vas; Peers ←     Plan: Peers,
//	                              Plan; NodeKeys ← Node Ready/taint/gone; Keys ←  NodeStatus
//	                              volumesInUse, verify, rebuild (held, then
//	                              released in two lanes: releaseKeys);
//	                              MigrationKeys ← CSINode; VolumeAttachment(
//	                              Changed) ← VA event; Detaching
//	vas          VA name          VolumeAttachment ← VA event (name unknown to    Volumes (adopt)
//	                              state.Names); UnknownVolumeAttachment ←
//	                              rebuild, verify
//	node status  node name        NodeStatus ← Node volumesAttached, Plan,        Detaching
//	                              rebuild
//
// A Pod reaches its node's status.volumesAttached in three passes over two
// queues: the Pod handler records it in the desired state and wakes its
// keys (no pass) → keys (create the VolumeAttachment, and decide again in
// the same pass: wait for the attacher; the informer's event of the
// created object is the version that pass decided on and wakes nothing)
// → keys again (woken by the VolumeAttachment's update once csi-attacher
// attached it: mark it attached, Plan wakes the node status) → node status
// (write the list). TestPodRoute_oneVolumeReachesNodeStatusInThreeQueuePasses
// counts them.
type wake struct {
	keys       *runner.Runner[state.Key]
	pods       *runner.Runner[string]
	nodeStatus *runner.Runner[string]
	vas        *runner.Runner[string]

	dsw   *state.Desired
	asw   *state.Actual
	names *state.Names
	// podStore and pvIndex read the informers' indexes (indexes.go).
	podStore podStore
	pvIndex  cache.Indexer
	// migrationByNode is decide.Config.MigrationByNode.
	migrationByNode map[string]bool

	// held collects the key wakes while the controller rebuilds its state
	// at start (holdKeys .. releaseKeys); nil otherwise.
	heldMu sync.Mutex
	held   map[state.Key]struct{}
	// heldPods and heldVAs collect, until releaseHeld, the Pod and
	// VolumeAttachment wakes of the informers' initial events (one per
	// object of the cluster); nil otherwise. The rebuild records every
	// Pod and registers every VolumeAttachment itself, so queued, these
	// would only run passes with nothing to do, and a queue's tables
	// (Go maps, which never shrink) would stay sized for the whole
	// cluster for the life of the process.
	heldPods map[string]struct{}
	heldVAs  map[string]struct{}

	// lose, set by tests before the controller runs, swallows the key
	// wake-ups it returns true for, held ones released after the rebuild
	// included: lost wake-ups, which the verify pass must make good.
	lose func(state.Key) bool
}

// runners returns the four queues, for Run and the backlog metrics.
func (w *wake) runners() []queue {
	return []queue{w.keys, w.pods, w.nodeStatus, w.vas}
}

// queue is what Run and the metrics need of a runner.
type queue interface {
	Run(ctx context.Context) error
	BacklogCollector() metrics.StableCollector
	Len() int
}

// backlog is the number of queued items over the four queues.
func (w *wake) backlog() int {
	n := 0
	for _, r := range w.runners() {
		n += r.Len()
	}
	return n
}

// --- The Pod queue ---

// Pod wakes the Pod namespace/name: it was added, changed or deleted.
func (w *wake) Pod(namespace, name string) {
	key := state.PodKey(namespace, name)
	if hold(&w.heldMu, &w.heldPods, key) {
		return
	}
	w.pods.Enqueue(key)
}

// HoldPod holds the wake of the Pod key while the controller rebuilds
// its state at start, and reports whether it did; the Pod handler records
// the Pod itself otherwise.
func (w *wake) HoldPod(key string) bool { return hold(&w.heldMu, &w.heldPods, key) }

// PodRecorded drops a held wake of the Pod key: the rebuild is about to
// record the Pod from the lister, which holds every change whose event
// woke it so far (a handler runs after its informer's store changed). A
// wake that comes after this stays held and is queued by releaseHeld.
func (w *wake) PodRecorded(key string) {
	w.heldMu.Lock()
	defer w.heldMu.Unlock()
	delete(w.heldPods, key)
}

// releaseHeld stops holding Pod and VolumeAttachment wakes and sends the
// held ones on: the Pods the rebuild did not record to the Pod queue, and
// each VolumeAttachment as VolumeAttachment would have (its key, still
// held until releaseKeys, when the rebuild registered its name; the
// VolumeAttachment queue otherwise). The rebuild calls it after it
// registered every name and before releaseKeys.
func (w *wake) releaseHeld() {
	w.heldMu.Lock()
	pods, vas := w.heldPods, w.heldVAs
	w.heldPods, w.heldVAs = nil, nil
	w.heldMu.Unlock()
	for key := range pods {
		w.pods.Enqueue(key)
	}
	for name := range vas {
		w.VolumeAttachment(name)
	}
}

// PodsBy wakes the Pods the Pod informer's index lists under value: the
// Pods that use a changed PVC (podByClaimIndex), an inline volume of a
// changed CSIDriver (podByInlineDriverIndex), or sit on a node that just
// became managed (podByNodeIndex).
func (w *wake) PodsBy(index, value string) {
	pods, err := w.podStore.byIndex(index, value)
	if err != nil {
		return
	}
	for _, pod := range pods {
		w.Pod(pod.namespace, pod.name)
	}
}

// PodsOfDriver wakes the Pods that use driver, inline or through a bound
// PV: whether it requires attach changed.
func (w *wake) PodsOfDriver(driver string) {
	w.PodsBy(podByInlineDriverIndex, driver)
	pvs, err := w.pvIndex.ByIndex(pvByDriverIndex, driver)
	if err != nil {
		return
	}
	for _, obj := range pvs {
		if pv, ok := obj.(*v1.PersistentVolume); ok && pv.Spec.ClaimRef != nil {
			w.PodsBy(podByClaimIndex, claimKey(pv.Spec.ClaimRef.Namespace, pv.Spec.ClaimRef.Name))
		}
	}
}

// --- The key queue ---

// key wakes k: held from the controller's construction until the rebuild
// at start ends (releaseKeys), queued at once afterwards.
func (w *wake) key(k state.Key) {
	if hold(&w.heldMu, &w.held, k) || w.lose != nil && w.lose(k) {
		return
	}
	w.keys.Enqueue(k)
}

// hold adds k to *held and reports true while holding is on (*held is
// not nil); under mu, which guards every held set.
func hold[K comparable](mu *sync.Mutex, held *map[K]struct{}, k K) bool {
	mu.Lock()
	defer mu.Unlock()
	if *held == nil {
		return false
	}
	(*held)[k] = struct{}{}
	return true
}

// releaseKeys queues the keys held since the controller was built (the
// wake-ups of the informers' initial events and of the rebuild, which
// wakes every key it knows, most of them more than once) once each, and
// stops holding: a key
// settled says has nothing to do (attached, reported and wanted, as
// before the restart) goes to the queue's low lane (Runner.EnqueueLater),
// every other key to the normal one. A change after the start (a Pod
// created while tens of thousands of settled keys wait) is then served
// after the keys that may need work, not behind every key of the cluster;
// the settled ones are still each reconciled once, when nothing else
// waits.
func (w *wake) releaseKeys(settled func(state.Key) bool) (urgent, later int) {
	w.heldMu.Lock()
	held := w.held
	w.held = nil
	w.heldMu.Unlock()
	for k := range held {
		if w.lose != nil && w.lose(k) {
			continue
		}
		if settled(k) {
			w.keys.EnqueueLater(k)
			later++
		} else {
			w.keys.Enqueue(k)
			urgent++
		}
	}
	return urgent, later
}

// Key wakes one (volume, node) key.
func (w *wake) Key(k state.Key) { w.key(k) }

// Keys wakes each of keys (and nothing else of their volumes).
func (w *wake) Keys(keys []state.Key) {
	for _, k := range keys {
		w.key(k)
	}
}

// Volumes wakes keys and every other key of their volumes: the decision
// for one node of a volume depends on its other nodes (multi-attach).
func (w *wake) Volumes(keys []state.Key) {
	done := map[v1.UniqueVolumeName]bool{}
	for _, k := range keys {
		w.key(k)
		if done[k.Volume] {
			continue
		}
		done[k.Volume] = true
		for _, e := range w.asw.ForVolume(k.Volume) {
			w.key(e.Key)
		}
		for _, n := range w.dsw.NodesWantingVolume(k.Volume) {
			w.key(state.Key{Volume: k.Volume, Node: n})
		}
	}
}

// NodeKeys wakes every key on node, wanted or attached: its readiness,
// out-of-service taint or existence changed.
func (w *wake) NodeKeys(node string) {
	for _, e := range w.asw.ForNode(node) {
		w.key(e.Key)
	}
	for _, wv := range w.dsw.VolumesOnNode(node) {
		w.key(state.Key{Volume: wv.Volume.UniqueName, Node: node})
	}
}

// Detaching wakes the keys of node that wait for the node status (state
// Detaching); called after every node status pass.
func (w *wake) Detaching(node string) {
	for _, e := range w.asw.ForNode(node) {
		if e.State == state.StateDetaching {
			w.key(e.Key)
		}
	}
}

// MigrationKeys wakes the keys of node whose decision depends on the
// node's CSINode: volumes wanted there that were translated from a plugin
// in Config.MigrationByNode. The desired state is indexed by node, so
// this reads only that node's volumes. Attached volumes nobody wants any
// more do not depend on the CSINode and are not woken.
func (w *wake) MigrationKeys(node string) { w.Keys(w.migrationKeys(node)) }

func (w *wake) migrationKeys(node string) []state.Key {
	if len(w.migrationByNode) == 0 {
		return nil
	}
	var out []state.Key
	for _, wv := range w.dsw.VolumesOnNode(node) {
		if w.migrationByNode[wv.Volume.MigratedFrom] {
			out = append(out, state.Key{Volume: wv.Volume.UniqueName, Node: node})
		}
	}
	return out
}

// Plan wakes what an executed plan asks for (decide.Plan.Wakes): when its
// actual state change applied, every other key of the volume (other nodes
// decide on this one; the key itself decides again in its own pass, see
// syncKey); the node status when the change adds the volume to the node's
// list or takes it off, or for a detach held back by Decide
// (KindWaitForNodeStatus). before is the entry the decision saw.
func (w *wake) Plan(p decide.Plan, before *state.Attachment, applied bool) {
	wk := p.Wakes(before, applied)
	if wk.Volume {
		w.Peers(p.Key)
	}
	if wk.NodeStatus {
		w.NodeStatus(p.Key.Node)
	}
}

// Peers wakes every key of k's volume but k: the volume's other nodes.
func (w *wake) Peers(k state.Key) {
	for _, e := range w.asw.ForVolume(k.Volume) {
		if e.Node != k.Node {
			w.key(e.Key)
		}
	}
	for _, n := range w.dsw.NodesWantingVolume(k.Volume) {
		if n != k.Node {
			w.key(state.Key{Volume: k.Volume, Node: n})
		}
	}
}

// --- The VolumeAttachment queue ---

// VolumeAttachment wakes the key of the VolumeAttachment name when the
// state.Names index knows it, and hands unknown names to the
// VolumeAttachment queue, which resolves them.
func (w *wake) VolumeAttachment(name string) {
	if hold(&w.heldMu, &w.heldVAs, name) {
		return
	}
	if key, ok := w.names.Get(name); ok {
		w.key(key)
		return
	}
	w.vas.Enqueue(name)
}

// VolumeAttachmentChanged is VolumeAttachment for an added or changed
// VolumeAttachment at version (state.VersionOf): a version the key's last
// pass decided on (our own create, read back through the overlay) wakes
// nothing, and one that comes during a pass of the key is left to the end
// of that pass (state.Names.PassDone).
func (w *wake) VolumeAttachmentChanged(name string, version uint64) {
	if hold(&w.heldMu, &w.heldVAs, name) {
		return
	}
	key, known, needed := w.names.Observe(name, version)
	switch {
	case !known:
		w.vas.Enqueue(name)
	case needed:
		w.key(key)
	}
}

// KnownVolumeAttachment wakes key, whose VolumeAttachment the queue
// resolved to a registered name: into the low lane when settled (see
// releaseKeys), the VolumeAttachment then being one of the initial list
// queued before the rebuild registered it.
func (w *wake) KnownVolumeAttachment(key state.Key, settled bool) {
	if settled {
		w.keys.EnqueueLater(key)
		return
	}
	w.key(key)
}

// UnknownVolumeAttachment hands name to the VolumeAttachment queue
// without asking the index (rebuild, verify drift).
func (w *wake) UnknownVolumeAttachment(name string) { w.vas.Enqueue(name) }

// --- The node status queue ---

// NodeStatus wakes the node status updater of node.
func (w *wake) NodeStatus(node string) { w.nodeStatus.Enqueue(node) }
