// Package controller is the I/O half of latch's attach/detach controller:
// informers and their event handlers feed the desired and actual state of
// the world (internal/attachdetach/state) and wake (wake.go) the (volume, node)
// keys a change affects; a runner of workers gathers the facts for one key,
// calls decide.Decide and executes the plan against the API server; a
// second runner keeps every Node's status.volumesAttached exact, batched
// per node.
//
// Nothing scans all volumes on a timer except the verify pass
// (Config.VerifyPeriod), which only enqueues keys whose VolumeAttachment
// and actual state disagree.
package controller

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/component-base/metrics"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/latchcsi/latch/internal/attachdetach/decide"
	"github.com/latchcsi/latch/internal/attachdetach/state"
	"github.com/latchcsi/latch/internal/attachdetach/volume"
	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/kube/kubenames"
	"github.com/latchcsi/latch/internal/runner"
)

// Config is the controller's configuration, filled from flags in cmd/.
type Config struct {
	// Workers reconcile (volume, node) keys in parallel
	// (--concurrent-attach-detach-syncs; default DefaultWorkers). The node
	// status updater gets its own workers (NodeStatusWorkers).
	Workers int
	// NodeStatusWorkers write Node.status.volumesAttached, one node each
	// at a time; default DefaultNodeStatusWorkers.
	NodeStatusWorkers int
	// MaxWaitForUnmount and DisableForceDetachOnTimeout: see decide.Config.
	MaxWaitForUnmount           time.Duration
	DisableForceDetachOnTimeout bool
	// VerifyPeriod is how often the actual state is compared with the
	// VolumeAttachments in the informer cache (--reconcile-sync); 0
	// disables the pass.
	VerifyPeriod time.Duration
	// UnseenWriteCheck is how long a VolumeAttachment create or delete of
	// the controller may go unseen by its informer before the API server
	// is asked about the object, and how often that is checked (whatever
	// VerifyPeriod is); 0 means DefaultUnseenWriteCheck. See
	// checkUnseenWrites.
	UnseenWriteCheck time.Duration
	// RetryIntervalStart and RetryIntervalMax bound the per-key backoff of
	// failed API writes; zero means the runner's defaults.
	RetryIntervalStart time.Duration
	RetryIntervalMax   time.Duration
	// MigratedPlugins is the set of in-tree plugins translated to CSI; nil
	// means volume.DefaultMigratedPlugins.
	MigratedPlugins map[string]bool
	// MigrationByNode lists in-tree plugins (csi-translation-lib names,
	// e.g. kubernetes.io/gce-pd) whose migration is treated as not
	// complete (--csi-migration-by-node): their volumes are attached
	// through CSI only on nodes whose CSINode lists the plugin in the
	// storage.alpha.kubernetes.io/migrated-plugins annotation. Empty (the
	// default) is kube-controller-manager 1.36's behaviour, where every
	// migration is complete and the annotation is never read. Each name
	// must be a plugin in MigratedPlugins.
	MigrationByNode []string
	// CoexistencePeriod (--coexistence-report-period) is how long the
	// competing-controllers gauge stays 1 after the last write seen from
	// another attach/detach controller, and how often at most that is
	// logged and evented (coexist.go); 0 disables the check.
	CoexistencePeriod time.Duration
	Clock             clock.WithTicker
	// QueueMetrics receives the workqueue_* metrics of the four queues;
	// nil means client-go's global provider (runner.Options).
	QueueMetrics workqueue.MetricsProvider
}

// Controller is the attach/detach controller.
type Controller struct {
	cfg      Config
	client   kubernetes.Interface
	recorder record.EventRecorder
	metrics  *Metrics
	clock    clock.WithTicker
	resolver *volume.Resolver
	decide   decide.Config

	dsw *state.Desired
	asw *state.Actual

	// pods is the Pod informer, for its handlers and indexes; its store
	// holds cachedPods and is read through podStore only.
	pods       cache.SharedIndexInformer
	podStore   podStore
	nodeLister corelisters.NodeLister
	pvcLister  corelisters.PersistentVolumeClaimLister
	pvs        cache.SharedIndexInformer
	pvLister   corelisters.PersistentVolumeLister
	drvLister  storagelisters.CSIDriverLister
	// vaCache is the only reader of the VolumeAttachment informer: its
	// store overlaid with our creates and deletes it has not shown yet
	// (kube.OverlaidStore).
	vaCache *kube.OverlaidStore[*storagev1.VolumeAttachment]
	// csiNodeLister holds trimmed CSINodes (name and the migrated-plugins
	// annotation only; see trimCSINode).
	csiNodeLister storagelisters.CSINodeLister
	synced        []cache.InformerSynced

	// wake owns the four queues and every wake-up (see wake.go).
	wake *wake

	// The bookkeeping, each piece a type that owns its lock, locks only
	// inside its own methods and calls nothing else while it holds it: no
	// lock is ever taken under another one's, so there is no order to
	// keep, except that a key pass holds its volume's lock (volumeLocks,
	// taken first, in syncKey) while it calls the others.
	//   asw          the actual state, with what each node's
	//                status.volumesAttached holds and the write in flight
	//                (state.Actual, state/nodelists.go)
	//   vaCache      our VolumeAttachment creates and deletes the informer
	//                has not shown (kube.OverlaidStore, above)
	//   podRec       the Pods recorded in the desired state (state.Pods)
	//   names        VolumeAttachment name → key (state.Names)
	//   timing       when attaches and detaches started (opTimes, optimes.go)
	//   waits        the keys waiting for their node's CSI migration
	//                (waitGauge, waitgauge.go)
	//   multiAttach  the keys waiting for another node to let their
	//                exclusive volume go (waitGauge, waitgauge.go)
	//   volumeLocks  one pass at a time per volume (volumelocks.go)
	//   podLocks     one recording at a time per Pod (volumelocks.go)
	//   returning    the Pods of nodes that came back, not yet recorded
	//                again (returningNodes, returning.go)
	podRec      *state.Pods
	names       *state.Names
	timing      *opTimes
	waits       *waitGauge
	multiAttach *waitGauge
	attachWaits *attachWaits
	volumeLocks volumeLocks
	podLocks    podLocks
	returning   *returningNodes
	// rebuilt is set once the rebuild recorded every Pod: from then on a
	// node that becomes managed has come back (nodeChanged).
	rebuilt atomic.Bool
	// handlerLogger is Run's logger, for the event handlers, which get no
	// context. Run sets it before the rebuild sets rebuilt, and handlers
	// log only once rebuilt is set.
	handlerLogger klog.Logger

	// coexist watches for another attach/detach controller (coexist.go).
	coexist *coexistence
}

// New wires the controller to the informers of factory (which the caller
// starts after New) and returns it. recorder receives the Pod events;
// metrics may be nil (nothing is recorded then). ctx is the context of
// the Pod informer's handler, which records Pods in the desired state
// (handlers.go); it should be the one Run is given.
func New(ctx context.Context, cfg Config, client kubernetes.Interface, factory informers.SharedInformerFactory, recorder record.EventRecorder, m *Metrics) (*Controller, error) {
	if cfg.Workers <= 0 {
		cfg.Workers = 50
	}
	if cfg.NodeStatusWorkers <= 0 {
		cfg.NodeStatusWorkers = DefaultNodeStatusWorkers
	}
	if cfg.MaxWaitForUnmount <= 0 {
		cfg.MaxWaitForUnmount = decide.DefaultMaxWaitForUnmount
	}
	if cfg.UnseenWriteCheck <= 0 {
		cfg.UnseenWriteCheck = DefaultUnseenWriteCheck
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if m == nil {
		m = NewMetrics()
	}
	byNode, err := migrationByNode(cfg)
	if err != nil {
		return nil, err
	}
	c := &Controller{
		cfg: cfg, client: client, recorder: recorder, metrics: m, clock: cfg.Clock,
		resolver: volume.NewResolver(cfg.MigratedPlugins),
		decide: decide.Config{MaxWaitForUnmount: cfg.MaxWaitForUnmount, DisableForceDetachOnTimeout: cfg.DisableForceDetachOnTimeout,
			MigrationByNode: byNode},
		dsw:         state.NewDesired(),
		asw:         state.NewActual(),
		podRec:      state.NewPods(),
		names:       state.NewNames(),
		timing:      newOpTimes(),
		returning:   newReturningNodes(),
		waits:       newWaitGauge(m.waitingForMigration),
		multiAttach: newWaitGauge(m.waitingForMultiAttach),
		attachWaits: newAttachWaits(m.attachTimeouts),
	}
	core, storage := factory.Core().V1(), factory.Storage().V1()
	c.pods = core.Pods().Informer()
	c.podStore = podStore{indexer: c.pods.GetIndexer()}
	c.pvs = core.PersistentVolumes().Informer()
	nodes, pvcs := core.Nodes().Informer(), core.PersistentVolumeClaims().Informer()
	drivers, vas := storage.CSIDrivers().Informer(), storage.VolumeAttachments().Informer()
	csiNodes := storage.CSINodes().Informer()
	// No Pod lister: the Pod informer holds cachedPods (podStore).
	c.nodeLister, c.pvcLister = core.Nodes().Lister(), core.PersistentVolumeClaims().Lister()
	c.pvLister, c.drvLister = core.PersistentVolumes().Lister(), storage.CSIDrivers().Lister()
	c.vaCache = kube.NewOverlaidStore(vas.GetStore(), kube.Typed[*storagev1.VolumeAttachment])
	c.csiNodeLister = storage.CSINodes().Lister()
	c.coexist = newCoexistence(cfg.CoexistencePeriod, cfg.Clock, recorder, m.competing, c.nodeManaged)
	informersUsed := []cache.SharedIndexInformer{c.pods, nodes, pvcs, c.pvs, drivers, vas}
	for _, inf := range informersUsed {
		// Nodes and VolumeAttachments show the coexistence guard their
		// managedFields before they are stripped.
		transform := kube.StripManagedFields
		switch inf {
		case c.pods:
			transform = TrimPod
		case pvcs:
			transform = trimPVC
		case c.pvs:
			transform = trimPV
		case nodes:
			transform = c.coexist.transformNode
		case vas:
			transform = c.coexist.transformVA
		}
		if err := inf.SetTransform(transform); err != nil {
			return nil, fmt.Errorf("set informer transform: %w", err)
		}
		c.synced = append(c.synced, inf.HasSynced)
	}
	if err := csiNodes.SetTransform(trimCSINode); err != nil {
		return nil, fmt.Errorf("set CSINode informer transform: %w", err)
	}
	c.synced = append(c.synced, csiNodes.HasSynced)
	if err := c.addIndexers(); err != nil {
		return nil, err
	}

	opts := func(name string, workers int) runner.Options {
		return runner.Options{
			Name: name, Workers: workers, Clock: cfg.Clock,
			RetryIntervalStart: cfg.RetryIntervalStart, RetryIntervalMax: cfg.RetryIntervalMax,
			MetricsProvider: cfg.QueueMetrics,
		}
	}
	c.wake = &wake{
		keys:            runner.New[state.Key](runner.ReconcilerFunc[state.Key](c.syncKey), opts("attachdetach_volumes", cfg.Workers)),
		pods:            runner.New[string](runner.ReconcilerFunc[string](c.syncPod), opts("attachdetach_pods", cfg.Workers)),
		nodeStatus:      runner.New[string](runner.ReconcilerFunc[string](c.syncNodeStatus), opts("attachdetach_node_status", cfg.NodeStatusWorkers)),
		vas:             runner.New[string](runner.ReconcilerFunc[string](c.syncVA), opts("attachdetach_volumeattachments", 2)),
		dsw:             c.dsw,
		asw:             c.asw,
		names:           c.names,
		podStore:        c.podStore,
		pvIndex:         c.pvs.GetIndexer(),
		migrationByNode: byNode,
		// Every key woken before the rebuild ends (by the informers'
		// initial events, then by the rebuild) is held and sorted into
		// the key queue's lanes by releaseKeys.
		held:     map[state.Key]struct{}{},
		heldPods: map[string]struct{}{},
		heldVAs:  map[string]struct{}{},
	}

	if err := c.addHandlers(ctx, nodes, pvcs, drivers, vas, csiNodes); err != nil {
		return nil, err
	}
	m.setSource(c)
	return c, nil
}

// BacklogCollectors returns the backlog age collectors of the work
// queues, for the binary to register.
func (c *Controller) BacklogCollectors() []metrics.StableCollector {
	var out []metrics.StableCollector
	for _, q := range c.wake.runners() {
		out = append(out, q.BacklogCollector())
	}
	return out
}

// Run waits for the caches, rebuilds the actual state, starts the workers
// and blocks until ctx is done and the workers have drained.
func (c *Controller) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	if !cache.WaitForNamedCacheSync("attachdetach-controller", ctx.Done(), c.synced...) {
		return fmt.Errorf("attachdetach-controller: caches did not sync: %w", ctx.Err())
	}
	c.handlerLogger = logger
	c.coexist.prime(logger)
	c.rebuild(ctx)
	logger.Info("Attach/detach controller started", "workers", c.cfg.Workers,
		"maxWaitForUnmount", c.cfg.MaxWaitForUnmount, "forceDetachOnTimeout", !c.cfg.DisableForceDetachOnTimeout,
		"verifyPeriod", c.cfg.VerifyPeriod, "csiMigrationByNode", c.cfg.MigrationByNode)

	var wg sync.WaitGroup
	queues := c.wake.runners()
	errs := make(chan error, len(queues))
	for _, q := range queues {
		wg.Go(func() { errs <- q.Run(ctx) })
	}
	if c.cfg.VerifyPeriod > 0 {
		wg.Go(func() { c.runVerify(ctx) })
	}
	wg.Go(func() { c.runUnseenWriteCheck(ctx) })
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	logger.Info("Attach/detach controller stopped")
	return nil
}

// migrationByNode validates cfg.MigrationByNode and returns it as a set.
func migrationByNode(cfg Config) (map[string]bool, error) {
	if len(cfg.MigrationByNode) == 0 {
		return nil, nil
	}
	if err := volume.CheckInTreePlugins(cfg.MigrationByNode); err != nil {
		return nil, fmt.Errorf("CSI migration by node: %w", err)
	}
	translated := cfg.MigratedPlugins
	if translated == nil {
		translated = volume.DefaultMigratedPlugins()
	}
	set := make(map[string]bool, len(cfg.MigrationByNode))
	for _, name := range cfg.MigrationByNode {
		if !translated[name] {
			return nil, fmt.Errorf("CSI migration by node: in-tree plugin %q is not translated to CSI at all", name)
		}
		set[name] = true
	}
	return set, nil
}

// nodeManaged says whether the node is in the cache with the
// controller-managed annotation.
func (c *Controller) nodeManaged(name string) bool {
	node, err := c.nodeLister.Get(name)
	if err != nil {
		return false
	}
	_, ok := node.Annotations[kubenames.ControllerManagedAttachAnnotation]
	return ok
}

// objects is the lister-backed volume.Objects.
type objects struct{ c *Controller }

var _ volume.Objects = objects{}

func (o objects) PersistentVolumeClaim(namespace, name string) (*v1.PersistentVolumeClaim, bool) {
	pvc, err := o.c.pvcLister.PersistentVolumeClaims(namespace).Get(name)
	return pvc, err == nil
}

func (o objects) PersistentVolume(name string) (*v1.PersistentVolume, bool) {
	pv, err := o.c.pvLister.Get(name)
	return pv, err == nil
}

func (o objects) CSIDriver(name string) (*storagev1.CSIDriver, bool) {
	d, err := o.c.drvLister.Get(name)
	return d, err == nil
}
