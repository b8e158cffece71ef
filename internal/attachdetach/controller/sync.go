package controller

import (
	"context"
	"fmt"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/attachdetach/decide"
	"github.com/latchcsi/latch/internal/attachdetach/state"
	"github.com/latchcsi/latch/internal/attachdetach/volume"
	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/runner"
)

// syncKey is one reconcile pass for a (volume, node) key: gather the
// facts, decide, execute.
func (c *Controller) syncKey(ctx context.Context, key state.Key) (runner.Result, error) {
	// The keys of one volume decide on each other (an exclusive volume
	// goes to one node): gathering, deciding and applying to the actual
	// state must not interleave between two of them, or two waiting nodes
	// can both see the volume free and both get a VolumeAttachment.
	defer c.volumeLocks.lock(key.Volume)()
	name, err := volume.AttachmentNameFor(key.Volume, key.Node)
	if err != nil {
		return runner.Result{}, runner.Terminal(fmt.Errorf("key %s: %w", key, err))
	}
	c.names.Set(name, key)
	in := decide.Gather(key, c.dsw, c.asw)
	node, err := listed(c.nodeLister.Get, key.Node)
	if err != nil {
		return runner.Result{}, fmt.Errorf("get node %s: %w", key.Node, err)
	}
	in.Node = decide.NodeFactsOf(node)
	in.Node.PodsPending = c.returning.pending(key.Node) > 0
	if in.Wanted != nil && c.decide.MigrationByNode[in.Wanted.Volume.MigratedFrom] {
		csiNode, err := listed(c.csiNodeLister.Get, key.Node)
		if err != nil {
			return runner.Result{}, fmt.Errorf("get CSINode %s: %w", key.Node, err)
		}
		in.CSINode = decide.CSINodeFactsOf(csiNode)
	}
	va, _, err := c.vaCache.Get(name)
	if err != nil {
		return runner.Result{}, fmt.Errorf("get VolumeAttachment %s: %w", name, err)
	}
	var settleErr error
	if va == nil && c.vaCache.IsCreateUncertain(name) {
		if va, settleErr = c.settleUncertainCreate(ctx, key, name); settleErr != nil {
			klog.FromContext(ctx).V(2).Info("Outcome of a VolumeAttachment create still unknown", "volumeAttachment", klog.KRef("", name), "err", settleErr)
		}
	}
	in.VA = decide.VAFactsOf(va)
	in.VA.MayExist = va == nil && c.vaCache.IsCreateUncertain(name)
	in.Config = c.decide
	in.Now = c.clock.Now()
	in.Listing = c.nodeListing(key, node)
	var informerList []v1.AttachedVolume
	if node != nil {
		informerList = node.Status.VolumesAttached
	}
	in.NodeStatusMayList = c.asw.NodeStatusMayList(key.Node, key.Volume, informerList)
	in.AttachWaitSince = c.attachWaits.since(key)
	plan := decide.Decide(in)
	if n := c.attachWaits.record(plan, in.Now); n > 0 {
		c.timing.attachTimedOut(key, n, in.Now, c.metrics)
	}
	if logger := klog.FromContext(ctx).V(4); logger.Enabled() {
		logger.Info("Decided", "volume", key.Volume, "node", klog.KRef("", key.Node), "plan", plan.Kind, "why", plan.Why,
			"wantedBy", wantedBy(in.Wanted), "actual", actualState(in.Actual), "va", vaState(in.VA), "peers", peerStates(in.Peers))
	}
	if in.Wanted != nil {
		c.waits.record(key, in.Wanted.Volume.MigratedFrom, plan.Kind == decide.KindNodeNotMigrated)
	} else {
		c.waits.record(key, "", false)
	}
	c.multiAttach.record(key, driverOf(key.Volume), plan.Kind == decide.KindConflict)
	result, err := c.execute(ctx, plan, va)
	c.forgetNameIfUnused(name, key)
	if err == nil && settleErr != nil {
		// Ask again, with backoff, until the API server answers.
		err = settleErr
	}
	return result, err
}

// forgetNameIfUnused drops the VolumeAttachment name of key from the name
// book once nothing is left of the key: no Pod wants it, the actual state
// has no entry, and no VolumeAttachment of that name exists (in the
// informer or among our own writes it has not shown yet). Without this the
// book would keep every name the controller ever saw. A VolumeAttachment
// of that name that appears later goes through the VA queue, which finds
// the key again.
func (c *Controller) forgetNameIfUnused(name string, key state.Key) {
	c.names.ForgetIf(name, key, func() bool {
		if _, ok := c.asw.Get(key); ok {
			return false
		}
		if _, ok := c.dsw.Get(key); ok {
			return false
		}
		_, exists, _ := c.vaCache.Get(name)
		return !exists
	})
}

// execute carries out plan: the actual state change first (it cannot
// fail), then the API action, then the events. va is the VolumeAttachment
// the decision saw (nil when absent).
func (c *Controller) execute(ctx context.Context, plan decide.Plan, va *storagev1.VolumeAttachment) (runner.Result, error) {
	key := plan.Key
	changed := plan.Actual != nil && c.asw.Apply(key, *plan.Actual)
	c.wake.Plan(plan, changed)

	var result runner.Result
	switch plan.Kind {
	case decide.KindNothing, decide.KindWait, decide.KindAttachError, decide.KindConflict, decide.KindForget, decide.KindNodeNotMigrated:
		if plan.Kind == decide.KindAttachError {
			c.timing.attachFailed(key, c.clock.Now(), c.metrics)
		}
		result.RequeueAfter = plan.RequeueAfter
	case decide.KindCreate:
		if err := c.createVA(ctx, plan); err != nil {
			return runner.Result{}, err
		}
	case decide.KindMarkAttached:
		c.attached(ctx, key, plan)
	case decide.KindWaitForNodeStatus:
		// The node status worker (woken by Plan or still busy with an
		// older list) wakes this key once the volume is off the list.
		klog.FromContext(ctx).V(4).Info("Waiting for the node status to drop the volume before detaching", "volume", key.Volume, "node", klog.KRef("", key.Node))
		return runner.Result{}, nil
	case decide.KindDetach:
		if err := c.deleteVA(ctx, plan, va); err != nil {
			return runner.Result{}, err
		}
	}
	c.emit(plan.Events)
	return result, nil
}

func (c *Controller) createVA(ctx context.Context, plan decide.Plan) error {
	logger := klog.FromContext(ctx)
	c.timing.attachStarted(plan.Key, c.clock.Now())
	name := plan.Create.Name
	c.vaCache.CreateStarted(name)
	created, err := c.client.StorageV1().VolumeAttachments().Create(ctx, plan.Create,
		metav1.CreateOptions{FieldManager: kube.AttachDetachFieldManager})
	if err != nil {
		c.vaCache.CreateFailed(name)
		// The API server may have stored the object although the answer
		// says otherwise (a 500 or a timeout after the write, a lost
		// answer followed by AlreadyExists): until it tells, the object
		// may exist and an exclusive volume stays blocked elsewhere.
		c.vaCache.CreateUncertain(name)
	} else {
		c.vaCache.CreateDone(name, created, c.clock.Now())
	}
	if apierrors.IsAlreadyExists(err) {
		// Our own creates are overlaid until a pass sees them, so this is
		// an object the controller could not know of: made by a previous
		// leader, or by an earlier call of ours whose response was lost.
		// Fetch it rather than wait for the informer, which may lag.
		logger.V(4).Info("VolumeAttachment already exists", "volumeAttachment", klog.KObj(plan.Create))
		_, err := c.settleUncertainCreate(ctx, plan.Key, name)
		return err
	}
	if err != nil {
		c.createFailed(ctx, plan.Key, err)
		return fmt.Errorf("create VolumeAttachment %s for volume %s on node %s (outcome unknown until the API server is asked): %w", name, plan.Key.Volume, plan.Key.Node, err)
	}
	logger.Info("Created VolumeAttachment", "volumeAttachment", klog.KObj(created), "volume", plan.Key.Volume, "node", klog.KRef("", plan.Key.Node))
	return nil
}

func (c *Controller) deleteVA(ctx context.Context, plan decide.Plan, va *storagev1.VolumeAttachment) error {
	logger := klog.FromContext(ctx)
	if va == nil {
		return nil
	}
	name := plan.Detach.Name
	uid := va.UID
	// Start the clock before the call: the informer may report the
	// deletion before Delete returns.
	c.timing.detachStarted(name, plan.Key, c.clock.Now())
	err := c.client.StorageV1().VolumeAttachments().Delete(ctx, name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{UID: &uid},
	})
	switch {
	case apierrors.IsNotFound(err):
		c.timing.detachCancelled(name)
		c.vaCache.Deleted(name, uid, true, c.clock.Now())
		return nil
	case err != nil:
		c.timing.detachCancelled(name)
	}
	switch {
	case apierrors.IsConflict(err):
		// A different VolumeAttachment of the same name exists now; the
		// informer will show it and the key gets decided again.
		return fmt.Errorf("delete VolumeAttachment %s (uid %s): replaced by another object: %w", name, uid, err)
	case err != nil:
		return fmt.Errorf("delete VolumeAttachment %s for volume %s on node %s: %w", name, plan.Key.Volume, plan.Key.Node, err)
	}
	c.vaCache.Deleted(name, uid, false, c.clock.Now())
	if plan.Detach.Reason.Forced() {
		c.metrics.forcedDetaches.WithLabelValues(string(plan.Detach.Reason)).Inc()
	}
	logger.Info("Deleted VolumeAttachment", "volumeAttachment", klog.KRef("", name), "volume", plan.Key.Volume, "node", klog.KRef("", plan.Key.Node), "reason", plan.Detach.Reason)
	return nil
}

// attached records the metrics of a confirmed attachment.
func (c *Controller) attached(ctx context.Context, key state.Key, plan decide.Plan) {
	now := c.clock.Now()
	c.timing.attachDone(key, now, c.metrics)
	klog.FromContext(ctx).Info("Volume attached", "volume", key.Volume, "node", klog.KRef("", key.Node))
	w, ok := c.dsw.Get(key)
	if !ok {
		return
	}
	for _, p := range w.Pods {
		c.podAttached(p, now)
	}
}

// podAttached observes the Pod's scheduled-to-attached latency once all
// its volumes are attached.
func (c *Controller) podAttached(p state.PodRef, now time.Time) {
	rec, ok := c.podRec.Get(state.PodKey(p.Namespace, p.Name))
	if !ok || rec.UID != p.UID {
		return
	}
	for _, v := range rec.Volumes {
		e, ok := c.asw.Get(state.Key{Volume: v.Volume.UniqueName, Node: rec.Node})
		if !ok || e.State != state.StateAttached {
			return
		}
	}
	if c.dsw.MarkReported(p.UID, "all-volumes-attached") {
		c.metrics.podVolumesAttached.Observe(now.Sub(rec.Scheduled).Seconds())
	}
}

// emit records the plan's events, each once per Pod.
func (c *Controller) emit(events []decide.Event) {
	for _, ev := range events {
		if !c.dsw.MarkReported(ev.Pod.UID, ev.DedupeKey) {
			continue
		}
		c.recorder.Event(podObject(ev.Pod), ev.Type, ev.Reason, ev.Message)
	}
}

// nodeListing gathers the facts of decide.NodeListing for key: what the
// Node (nil when it does not exist) and the controller's own writes of its
// status say about the key's volume.
func (c *Controller) nodeListing(key state.Key, node *v1.Node) *decide.NodeListing {
	if node == nil {
		return nil
	}
	return &decide.NodeListing{
		InUse:    slices.Contains(node.Status.VolumesInUse, key.Volume),
		Attached: slices.ContainsFunc(node.Status.VolumesAttached, func(av v1.AttachedVolume) bool { return av.Name == key.Volume }),
		Written:  c.asw.NodeStatusWritten(key.Node, key.Volume),
	}
}

// listed reads name with a lister's Get; not found is (nil, nil).
func listed[T any](get func(string) (*T, error), name string) (*T, error) {
	obj, err := get(name)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	return obj, err
}

// wantedBy, actualState, vaState and peerStates are the facts of a
// decision as the decision log (-v=4) shows them.
func wantedBy(w *state.Wanted) int {
	if w == nil {
		return 0
	}
	return len(w.Pods)
}

func actualState(a *state.Attachment) string {
	if a == nil {
		return "none"
	}
	return fmt.Sprintf("%s reported=%t", a.State, a.ReportedInNodeStatus)
}

func vaState(f decide.VAFacts) string {
	if !f.Exists {
		return fmt.Sprintf("none mayExist=%t", f.MayExist)
	}
	return fmt.Sprintf("attached=%t deleting=%t attachError=%t detachError=%t", f.Attached, f.Deleting, f.AttachError != nil, f.DetachError != nil)
}

func peerStates(peers []decide.Peer) []string {
	out := make([]string, 0, len(peers))
	for _, p := range peers {
		out = append(out, fmt.Sprintf("%s:%s/pods=%d", p.Node, p.State, len(p.Pods)))
	}
	return out
}
