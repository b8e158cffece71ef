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

// maxDecisions bounds the decisions of one key pass; a pass that still
// changes the actual state after that many wakes its key again.
const maxDecisions = 5

// syncKey is one reconcile pass for a (volume, node) key: gather the
// facts, decide, execute. A decision that changed the actual state (or
// created the VolumeAttachment) may lead to another with no new event
// (an entry recorded, then found unmounted; a create, then the wait for
// the attacher): the pass gathers and decides again until a decision
// changes nothing, rather than queueing the key for a pass of its own.
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
	c.names.Pass(name)
	var (
		result  runner.Result
		decided uint64
	)
	for n := 1; ; n++ {
		var va *storagev1.VolumeAttachment
		var again bool
		va, result, again, err = c.decideOnce(ctx, key, name)
		decided = 0
		if va != nil {
			decided = state.VersionOf(string(va.UID), va.ResourceVersion)
		}
		if err != nil || !again {
			break
		}
		if n == maxDecisions {
			c.wake.Key(key)
			break
		}
	}
	if c.names.PassDone(name, decided, err == nil) {
		c.wake.Key(key)
	}
	c.forgetNameIfUnused(name, key)
	return result, err
}

// decideOnce gathers the facts of key, decides and executes the plan. It
// returns the VolumeAttachment the decision saw (nil when absent) and
// whether the plan changed the actual state or created the
// VolumeAttachment, so that deciding again may find more to do.
func (c *Controller) decideOnce(ctx context.Context, key state.Key, name string) (*storagev1.VolumeAttachment, runner.Result, bool, error) {
	in := decide.Gather(key, c.dsw, c.asw)
	node, err := listed(c.nodeLister.Get, key.Node)
	if err != nil {
		return nil, runner.Result{}, false, fmt.Errorf("get node %s: %w", key.Node, err)
	}
	in.Node = decide.NodeFactsOf(node)
	in.Node.PodsPending = c.returning.pending(key.Node) > 0
	if in.Wanted != nil && c.decide.MigrationByNode[in.Wanted.Volume.MigratedFrom] {
		csiNode, err := listed(c.csiNodeLister.Get, key.Node)
		if err != nil {
			return nil, runner.Result{}, false, fmt.Errorf("get CSINode %s: %w", key.Node, err)
		}
		in.CSINode = decide.CSINodeFactsOf(csiNode)
	}
	va, _, err := c.vaCache.Get(name)
	if err != nil {
		return nil, runner.Result{}, false, fmt.Errorf("get VolumeAttachment %s: %w", name, err)
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
	result, again, err := c.execute(ctx, plan, in.Actual, va)
	if err == nil && settleErr != nil {
		// Ask again, with backoff, until the API server answers.
		err = settleErr
	}
	return va, result, again, err
}

// forgetNameIfUnused drops the VolumeAttachment name of key from the name
// book once nothing is left of the key: no Pod wants it, the actual state
// has no entry, and no VolumeAttachment of that name exists (in the
// informer or among our own writes it has not shown yet). Without this the
// book would keep every name the controller ever saw. A VolumeAttachment
// of that name that appears later goes through the VA queue, which finds
// the key again.
//
// The caller holds the key's volume lock, which adopt takes too: the
// actual state cannot gain the key between the check and the drop.
func (c *Controller) forgetNameIfUnused(name string, key state.Key) {
	_, attached := c.asw.Get(key)
	_, wanted := c.dsw.Get(key)
	_, exists, _ := c.vaCache.Get(name)
	c.names.ForgetIf(name, key, !attached && !wanted && !exists)
}

// execute carries out plan: the actual state change first (it cannot
// fail), then the API action, then the events. before is the actual state
// entry the decision saw and va the VolumeAttachment (nil when absent).
// again reports whether deciding once more may find more to do: the
// actual state changed, or the VolumeAttachment was created.
func (c *Controller) execute(ctx context.Context, plan decide.Plan, before *state.Attachment, va *storagev1.VolumeAttachment) (result runner.Result, again bool, err error) {
	key := plan.Key
	if plan.Kind == decide.KindCreate {
		// The create first, then the actual state change and the wakes,
		// whatever the answer: an entry whose create failed still holds
		// the volume while the outcome is unknown. No decision of the
		// volume's other nodes can come in between (volumeLocks), and
		// the node status does not list an attaching entry.
		created, createErr := c.sendCreate(ctx, plan)
		changed := plan.Actual != nil && c.asw.Apply(key, *plan.Actual)
		c.wake.Plan(plan, before, changed)
		if err := c.createAnswered(ctx, plan, created, createErr); err != nil {
			return runner.Result{}, false, err
		}
		c.emit(plan.Events)
		return runner.Result{}, true, nil
	}
	changed := plan.Actual != nil && c.asw.Apply(key, *plan.Actual)
	c.wake.Plan(plan, before, changed)

	switch plan.Kind {
	case decide.KindNothing, decide.KindWait, decide.KindAttachError, decide.KindConflict, decide.KindForget, decide.KindNodeNotMigrated:
		if plan.Kind == decide.KindAttachError {
			c.timing.attachFailed(key, c.clock.Now(), c.metrics)
		}
		result.RequeueAfter = plan.RequeueAfter
	case decide.KindMarkAttached:
		c.attached(ctx, key, plan)
	case decide.KindWaitForNodeStatus:
		// The node status worker (woken by Plan or still busy with an
		// older list) wakes this key once the volume is off the list.
		klog.FromContext(ctx).V(4).Info("Waiting for the node status to drop the volume before detaching", "volume", key.Volume, "node", klog.KRef("", key.Node))
		return runner.Result{}, changed, nil
	case decide.KindDetach:
		if err := c.deleteVA(ctx, plan, va); err != nil {
			return runner.Result{}, false, err
		}
	}
	c.emit(plan.Events)
	return result, changed, nil
}

// sendCreate sends the create of plan's VolumeAttachment and notes it in
// the overlay: done with the object the server stored, or of unknown
// outcome on any error (the API server may have stored the object
// although the answer says otherwise: a 500 or a timeout after the write,
// a lost answer followed by AlreadyExists; until it tells, the object may
// exist and an exclusive volume stays blocked elsewhere).
func (c *Controller) sendCreate(ctx context.Context, plan decide.Plan) (*storagev1.VolumeAttachment, error) {
	c.timing.attachStarted(plan.Key, c.clock.Now())
	name := plan.Create.Name
	c.vaCache.CreateStarted(name)
	created, err := c.client.StorageV1().VolumeAttachments().Create(ctx, plan.Create,
		metav1.CreateOptions{FieldManager: kube.AttachDetachFieldManager})
	if err != nil {
		c.vaCache.CreateFailed(name)
		c.vaCache.CreateUncertain(name)
		return nil, err
	}
	c.vaCache.CreateDone(name, created, c.clock.Now())
	return created, nil
}

// createAnswered handles the answer of sendCreate once the plan's actual
// state change is applied: an object that already exists is fetched, a
// failure is reported to the Pods and returned.
func (c *Controller) createAnswered(ctx context.Context, plan decide.Plan, created *storagev1.VolumeAttachment, err error) error {
	logger := klog.FromContext(ctx)
	name := plan.Create.Name
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
