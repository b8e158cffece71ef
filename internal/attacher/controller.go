package attacher

import (
	"context"
	"fmt"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/client-go/kubernetes"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/latchcsi/latch/internal/attacher/decide"
	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/kube/kubenames"
	"github.com/latchcsi/latch/internal/runner"
)

// DefaultWorkers is --worker-threads' default: the most CSI publish and
// unpublish calls in flight at once, attaches and detaches together
// (upstream's meaning of its worker threads, whose default is 10). With
// adaptive driver concurrency (the default) it is only the bound: the
// limit starts at 10 and follows what the backend takes
// (docs/performance.md, "Adaptive driver concurrency").
const DefaultWorkers = 100

// Driver concurrency modes (--driver-concurrency).
const (
	// ConcurrencyAdaptive: the limit of calls in flight follows the
	// backend (package adaptive), between 2 and Workers.
	ConcurrencyAdaptive = "adaptive"
	// ConcurrencyFixed: the limit is Workers.
	ConcurrencyFixed = "fixed"
)

// DefaultKubeAPIQPS and DefaultKubeAPIBurst are the client-side limits
// towards the API server (upstream: 5 and 10). An attach makes three
// writes; at 5000/10000 a burst of 2,000 attaches (6,000 writes) fits in
// the burst, so the API server, not the client, paces it (a fast 2-core
// control plane finished it in about 4 s). The limits only have to catch a
// runaway loop; API Priority and Fairness protects the server.
const (
	DefaultKubeAPIQPS   = 5000
	DefaultKubeAPIBurst = 10000
)

// DefaultAPIWorkers is how many VolumeAttachments a queue works on at once
// when --api-worker-threads is 0: enough passes that the API writes of
// some overlap the driver calls of the others (200 measured best in the
// attach burst benchmark), and never fewer than two per CSI call slot.
func DefaultAPIWorkers(workers int) int { return max(200, 2*workers) }

// Annotations latch adds to a VolumeAttachment (package decide owns them).
const (
	// AnnVolumeHandle is the CSI volume handle the volume was published with.
	AnnVolumeHandle = decide.AnnVolumeHandle
	// AnnSecretRef is "namespace/name" of the controller-publish secret, if any.
	AnnSecretRef = decide.AnnSecretRef
)

// DriverInfo is what the decisions need to know about the driver
// (Config.Driver).
type DriverInfo = decide.DriverInfo

// Config is the attacher's configuration, filled from flags in cmd/.
type Config struct {
	Driver DriverInfo
	// Trivial: the driver has no PUBLISH_UNPUBLISH_VOLUME; VAs are marked
	// attached without calling it and get no finalizers.
	Trivial bool
	// Workers bounds how many CSI publish and unpublish calls may be in
	// flight at once, attaches and detaches together (while both wait,
	// each gets half), and is the number of PV queue workers.
	Workers int
	// DriverConcurrency is ConcurrencyAdaptive (the default, also for
	// "") or ConcurrencyFixed.
	DriverConcurrency string
	// APIWorkers is, per attach and detach queue, how many VolumeAttachments
	// are worked on at once; at most Workers of them call the driver at a
	// time, the others do their API writes meanwhile. 0 means
	// DefaultAPIWorkers(Workers).
	APIWorkers         int
	Timeout            time.Duration // one ControllerPublish/Unpublish call
	RetryIntervalStart time.Duration
	RetryIntervalMax   time.Duration
	// SecretRetryInterval is how often a VA waiting for a missing secret is
	// retried; secrets are not watched (that would need list/watch on every
	// Secret in the cluster).
	SecretRetryInterval time.Duration
	// ReconcileSync is the ListVolumes reconcile period; 0 disables it.
	ReconcileSync time.Duration
	// ReconcileTimeout bounds one full ListVolumes pass (all pages).
	ReconcileTimeout time.Duration
	MaxEntries       int
	Clock            clock.WithTicker
	// OrphanNamespace is where the ConfigMap recording publications to
	// undo (orphans.go) lives: the attacher's own namespace. Empty keeps
	// them in memory only.
	OrphanNamespace string
	// QueueMetrics receives the workqueue_* metrics of the three queues:
	// the binary's runner.QueueMetrics, registered with its registry. Nil:
	// client-go's process-wide provider (runner.Options.MetricsProvider).
	QueueMetrics workqueue.MetricsProvider
}

// Controller is the csi-attacher controller for one driver.
type Controller struct {
	cfg   Config
	clock clock.WithTicker
	// exec makes every API write and CSI call of a plan (executor.go);
	// the Controller observes, decides and routes.
	exec *executor

	vaInformer cache.SharedIndexInformer
	// vaCache and pvCache are the only readers of the VolumeAttachment and
	// PV informers' stores: those hold ForeignVA/ForeignPV placeholders
	// for other drivers' objects (see Transform), which the readers decode
	// (decodeVA, decodePV), and every read goes through the overlay of our
	// own writes (kube.OverlaidStore), which the executor records into.
	vaCache    *kube.OverlaidStore[*storagev1.VolumeAttachment]
	pvCache    *kube.OverlaidStore[*v1.PersistentVolume]
	nodeLister storagelisters.CSINodeLister
	synced     []cache.InformerSynced

	attach *runner.Runner[string]
	detach *runner.Runner[string]
	pvs    *runner.Runner[string]

	// route makes one pass at a time, in one lane (attach or detach), the
	// owner of a VA's work (route, below).
	route *route
	// orphans owns the publications that may be on a node without a
	// VolumeAttachment of ours standing for them, and the record entries
	// done with (orphans.go).
	orphans *ledger

	// vaEchoSeen, when set (tests only, before the informers start), is
	// told of every update of one of our VolumeAttachments the informer
	// delivers, and whether it was recognised as our own write.
	vaEchoSeen func(va *storagev1.VolumeAttachment, own bool)
}

const (
	vaByPVIndex   = "latch-va-by-pv"
	vaByNodeIndex = "latch-va-by-node"
	// vaByNodeIDIndex: our VolumeAttachments by their node-id annotation,
	// to find what claims an orphan's publication (claimCandidates).
	vaByNodeIDIndex = "latch-va-by-node-id"
)

// New wires the controller to inf (NewInformers); call Run after starting
// them.
func New(cfg Config, client kubernetes.Interface, inf *Informers, csiClient CSIClient, recorder record.EventRecorder, metrics *Metrics) (*Controller, error) {
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.SecretRetryInterval <= 0 {
		cfg.SecretRetryInterval = 10 * time.Second
	}
	if cfg.ReconcileTimeout <= 0 {
		cfg.ReconcileTimeout = 5 * time.Minute
	}
	c := &Controller{
		cfg: cfg, clock: cfg.Clock,
		orphans: newLedger(),
	}
	c.vaInformer = inf.vas
	c.nodeLister = inf.csiNodeLister
	c.vaCache = kube.NewOverlaidStore(inf.vas.GetStore(), decodeVA)
	c.pvCache = kube.NewOverlaidStore(inf.pvs.GetStore(), decodePV)
	c.synced = []cache.InformerSynced{inf.vas.HasSynced, inf.pvs.HasSynced, inf.csiNodes.HasSynced}

	if err := c.vaInformer.AddIndexers(cache.Indexers{
		vaByPVIndex: func(obj any) ([]string, error) {
			va, ok := obj.(*storagev1.VolumeAttachment)
			if !ok || va.Spec.Source.PersistentVolumeName == nil {
				return nil, nil
			}
			return []string{*va.Spec.Source.PersistentVolumeName}, nil
		},
		vaByNodeIndex: func(obj any) ([]string, error) {
			va, ok := obj.(*storagev1.VolumeAttachment)
			if !ok || va.Spec.Attacher != cfg.Driver.Name {
				return nil, nil
			}
			return []string{va.Spec.NodeName}, nil
		},
		vaByNodeIDIndex: func(obj any) ([]string, error) {
			va, ok := obj.(*storagev1.VolumeAttachment)
			if !ok || va.Spec.Attacher != cfg.Driver.Name || va.Annotations[kubenames.VANodeIDAnnotation] == "" {
				return nil, nil
			}
			return []string{va.Annotations[kubenames.VANodeIDAnnotation]}, nil
		},
	}); err != nil {
		return nil, fmt.Errorf("add VolumeAttachment indexers: %w", err)
	}

	opts := func(name string, workers int) runner.Options {
		return runner.Options{
			Name: name, Workers: workers, Clock: cfg.Clock, MetricsProvider: cfg.QueueMetrics,
			RetryIntervalStart: cfg.RetryIntervalStart, RetryIntervalMax: cfg.RetryIntervalMax,
		}
	}
	apiWorkers := cfg.APIWorkers
	if apiWorkers <= 0 {
		apiWorkers = DefaultAPIWorkers(cfg.Workers)
	}
	apiWorkers = max(apiWorkers, cfg.Workers)
	// Attach and detach get queues and workers of their own, and share
	// one limit of CSI calls in flight in which each keeps half while both
	// wait: a burst of one can never starve the other. A pass spends most
	// of its time on API writes (PV and VA finalizers, status) around one
	// CSI call, so more passes run than CSI calls are allowed: the writes
	// of some overlap the driver calls of others, while the driver sees at
	// most the limit, never more than Workers, as with upstream's worker
	// threads.
	c.exec = &executor{
		driver: cfg.Driver, timeout: cfg.Timeout, secretRetryInterval: cfg.SecretRetryInterval,
		client: client, csi: csiClient, vaCache: c.vaCache, pvCache: c.pvCache,
		calls: newCallLimiter(cfg, metrics), recorder: recorder, metrics: metrics, clock: cfg.Clock,
	}
	if cfg.OrphanNamespace != "" && !cfg.Trivial {
		c.exec.records = newConfigMapOrphanStore(client, cfg.OrphanNamespace, cfg.Driver.Name)
	}
	c.attach = runner.New[string](runner.ReconcilerFunc[string](c.syncAttach), opts(AttachQueueName, apiWorkers))
	c.route = newRoute(c.enqueue)
	c.detach = runner.New[string](runner.ReconcilerFunc[string](c.syncDetach), opts(DetachQueueName, apiWorkers))
	c.pvs = runner.New[string](runner.ReconcilerFunc[string](c.syncPV), opts(PVQueueName, cfg.Workers))

	if _, err := c.vaInformer.AddEventHandler(kube.ChangeHandlers(c.vaChanged, c.vaDeleted)); err != nil {
		return nil, err
	}
	if _, err := inf.pvs.AddEventHandler(kube.ChangeHandlers(c.pvChanged, c.pvDeleted)); err != nil {
		return nil, err
	}
	if _, err := inf.csiNodes.AddEventHandler(kube.ChangeHandlers(c.csiNodeChanged, nil)); err != nil {
		return nil, err
	}
	return c, nil
}

// Run waits for the caches and runs all queues (and the ListVolumes
// reconciler when configured) until ctx is done.
func (c *Controller) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	if !cache.WaitForNamedCacheSync("csi-attacher", ctx.Done(), c.synced...) {
		return fmt.Errorf("caches did not sync: %w", ctx.Err())
	}
	logger.Info("csi-attacher started", "driver", c.cfg.Driver.Name, "trivial", c.cfg.Trivial, "workers", c.cfg.Workers, "driverConcurrency", c.cfg.DriverConcurrency)
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	run := func(r *runner.Runner[string]) {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- r.Run(ctx) }()
	}
	// Detaches do not depend on orphans: they go at once.
	run(c.detach)
	if c.cfg.ReconcileSync > 0 && !c.cfg.Trivial {
		wg.Add(1)
		go func() { defer wg.Done(); c.runReconciler(ctx) }()
	}
	// Publications an earlier attacher could not undo are queued before
	// any VolumeAttachment is attached, so a new VA of the same name waits
	// for them (and its own orphan cannot overwrite their record), and
	// before any PV finalizer is removed (an orphan may hold the PV): the
	// attach and PV queues start only once the record was read, retried
	// with backoff while that fails.
	if c.loadOrphans(ctx) {
		run(c.attach)
		run(c.pvs)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// Backlogs exposes the queues, for metrics.
func (c *Controller) Backlogs() []*runner.Runner[string] {
	return []*runner.Runner[string]{c.attach, c.detach, c.pvs}
}

func (c *Controller) ours(obj any) (*storagev1.VolumeAttachment, bool) {
	va, ok := obj.(*storagev1.VolumeAttachment)
	return va, ok && va.Spec.Attacher == c.cfg.Driver.Name
}

func (c *Controller) vaChanged(oldObj, obj any) {
	va, ok := c.ours(obj)
	if !ok {
		return
	}
	old, _ := oldObj.(*storagev1.VolumeAttachment)
	own := c.vaCache.IsOwnUpdate(old, va)
	if c.vaEchoSeen != nil {
		c.vaEchoSeen(va, own)
	}
	if own {
		// Our own write coming back through the watch, before or after
		// its call returned: the pass that made it already did
		// everything that followed from it.
		return
	}
	c.send(va)
}

// send enqueues va in the lane its state calls for.
func (c *Controller) send(va *storagev1.VolumeAttachment) {
	c.enqueue(laneOf(va.DeletionTimestamp != nil), va.Name)
}

func (c *Controller) vaDeleted(obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	va, ok := obj.(*storagev1.VolumeAttachment)
	if !ok {
		return
	}
	c.vaCache.Forget(va.Name)
	if va.Spec.Source.PersistentVolumeName != nil {
		// The PV may have been waiting for this VA to go before its
		// finalizer can be removed.
		c.pvs.Enqueue(*va.Spec.Source.PersistentVolumeName)
	}
}

// pvDeleted drops what we remember of our own writes to the PV: the
// removal of our finalizer from a PV being deleted is usually the last.
func (c *Controller) pvDeleted(obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	if pv, ok := obj.(*v1.PersistentVolume); ok {
		c.pvCache.Forget(pv.Name)
	}
}

func (c *Controller) pvChanged(oldObj, obj any) {
	var name string
	switch pv := obj.(type) {
	case *v1.PersistentVolume:
		old, _ := oldObj.(*v1.PersistentVolume)
		if c.pvCache.IsOwnUpdate(old, pv) {
			return
		}
		if c.releasablePV(pv) {
			c.pvs.Enqueue(pv.Name)
		}
		name = pv.Name
	case *ForeignPV:
		// Another driver's PV: nothing to do for it, but a VA of ours
		// waiting for a PV of that name learns now whose it is.
		name = pv.Name
	default:
		return
	}
	if oldObj != nil {
		return
	}
	// A PV appeared: VAs that were waiting for it go now, not after
	// their backoff.
	objs, _ := c.vaInformer.GetIndexer().ByIndex(vaByPVIndex, name)
	for _, o := range objs {
		if va, ok := c.ours(o); ok && !va.Status.Attached && va.DeletionTimestamp == nil {
			c.attach.ForgetAndEnqueue(va.Name)
		}
	}
}

func (c *Controller) csiNodeChanged(oldObj, obj any) {
	node, ok := obj.(*storagev1.CSINode)
	if !ok {
		return
	}
	newID, _ := decide.CSINodeID(node, c.cfg.Driver.Name)
	if oldObj != nil {
		if old, ok := oldObj.(*storagev1.CSINode); ok {
			if oldID, _ := decide.CSINodeID(old, c.cfg.Driver.Name); oldID == newID {
				return
			}
		}
	}
	if newID == "" {
		return
	}
	// The driver registered on the node: VAs blocked on it retry now.
	objs, _ := c.vaInformer.GetIndexer().ByIndex(vaByNodeIndex, node.Name)
	for _, o := range objs {
		va := o.(*storagev1.VolumeAttachment)
		switch {
		case va.DeletionTimestamp != nil:
			c.detach.ForgetAndEnqueue(va.Name)
		case !va.Status.Attached:
			c.attach.ForgetAndEnqueue(va.Name)
		}
	}
}

// direction is which lane of the VolumeAttachment route a pass runs in:
// attaches and detaches keep workers and CSI call slots of their own, so a
// burst of one never starves the other.
type direction int

const (
	attachDir direction = iota
	detachDir
	// nowhere: the pass left nothing for another lane.
	nowhere direction = -1
)

// laneOf is the lane va's work belongs in: a VolumeAttachment being
// deleted is detached, any other attached.
func laneOf(deleting bool) direction {
	if deleting {
		return detachDir
	}
	return attachDir
}

// route owns where a VolumeAttachment's work runs: one pass at a time,
// in one lane, per name. A pass takes the name before it reads the object
// and gives it back when done, saying in which lane the name must run next
// (a pass that finds the object belongs to the other lane does no work
// there); route, never the pass, enqueues it. A pass that finds the name
// held by the other lane does not poll: it is recorded as waiting and
// woken by the release.
type route struct {
	mu sync.Mutex
	// held maps a name a pass works on to the lanes waiting for it.
	held map[string]*[2]bool
	// wake enqueues name in the lane dir.
	wake func(dir direction, name string)
}

func newRoute(wake func(direction, string)) *route {
	return &route{held: map[string]*[2]bool{}, wake: wake}
}

// take makes the caller name's owner and returns true, or, when another
// pass holds it, records dir as waiting and returns false: release wakes it.
func (r *route) take(dir direction, name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if waiting, ok := r.held[name]; ok {
		waiting[dir] = true
		return false
	}
	r.held[name] = &[2]bool{}
	return true
}

// release ends the caller's ownership of name and wakes the lanes that
// found it held meanwhile, and next, the lane the pass says the name
// belongs in now (nowhere: none).
func (r *route) release(name string, next direction) {
	r.mu.Lock()
	waiting := r.held[name]
	delete(r.held, name)
	r.mu.Unlock()
	if waiting == nil {
		waiting = &[2]bool{}
	}
	if next != nowhere {
		waiting[next] = true
	}
	for dir, w := range waiting {
		if w {
			r.wake(direction(dir), name)
		}
	}
}

// enqueue wakes name in the lane dir.
func (c *Controller) enqueue(dir direction, name string) {
	if dir == attachDir {
		c.attach.Enqueue(name)
	} else {
		c.detach.Enqueue(name)
	}
}
