package attacher

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/attacher/decide"
	"github.com/latchcsi/latch/internal/csi"
	"github.com/latchcsi/latch/internal/runner"
)

// Event reasons of orphaned publications. The events name a
// VolumeAttachment that is gone or was replaced by a new object of the same
// name; they are recorded in the "default" namespace like every event of a
// cluster-scoped object.
const (
	EventOrphanedPublication = "OrphanedPublication"
	EventOrphanRecordFailed  = "OrphanRecordFailed"
)

// orphan is a publication whose VolumeAttachment was deleted, or deleted
// and re-created under the same name, while the driver published it: no
// finalizer kept the object, and no detach will come for it. The attach
// queue undoes it under the VolumeAttachment's name.
type orphan struct {
	// name and uid name the VolumeAttachment the volume was published for.
	name           string
	uid            types.UID
	handle, nodeID string
	// nodeName is the VolumeAttachment's spec.nodeName, to find another
	// VolumeAttachment that owns the same publication.
	nodeName  string
	secretRef *v1.SecretReference
	// pvName is the PersistentVolume the volume was published from ("" for
	// an inline volume or a record of an older attacher): its finalizer
	// stays while the orphan is pending.
	pvName string
	// secrets are the values the publish used; nil after a restart, when
	// they are read again through secretRef.
	secrets map[string]string
	// uncertain: the publish failed with an unknown outcome, and no
	// unpublish has been answered with a final code since; the driver may
	// still be publishing (decide.Orphan.Uncertain).
	uncertain bool
	// recorded: the durable record holds this orphan.
	recorded bool
	// unpublished: the driver unpublished it; only its record is left to
	// remove.
	unpublished bool
	// singleNode: the publish's access modes allow the volume on one node
	// only (decide.SingleNode); not known for a record read back.
	singleNode bool
}

func (o orphan) same(p orphan) bool {
	return o.uid == p.uid && o.handle == p.handle && o.nodeID == p.nodeID
}

// facts is what package decide's orphan decisions need of o.
func (o orphan) facts() decide.Orphan {
	return decide.Orphan{Handle: o.handle, NodeID: o.nodeID, VA: o.name, NodeName: o.nodeName, UID: o.uid,
		PV: o.pvName, Uncertain: o.uncertain, SingleNode: o.singleNode}
}

// publicationOf is the publication made (or possibly made: uncertain) for
// va with plan.
func publicationOf(va *storagev1.VolumeAttachment, plan decide.AttachPlan, secrets map[string]string, uncertain bool) orphan {
	o := orphan{name: va.Name, uid: va.UID, handle: plan.Volume.Handle, nodeID: plan.NodeID,
		nodeName: va.Spec.NodeName, secretRef: plan.Volume.Secret, secrets: secrets, uncertain: uncertain,
		singleNode: decide.SingleNode(plan.Volume.AccessModes)}
	if pv := va.Spec.Source.PersistentVolumeName; pv != nil {
		o.pvName = *pv
	}
	return o
}

// publishedForGone makes the publication (uncertain: possible publication)
// made for va, which is gone or replaced, an orphan and tries to undo it
// at once; while that fails, the attach queue retries it under va's name
// before any VolumeAttachment of that name is worked on. It is the
// executor's orphaned hook.
func (c *Controller) publishedForGone(ctx context.Context, va *storagev1.VolumeAttachment, plan decide.AttachPlan, secrets map[string]string, cause error, uncertain bool) (runner.Result, error) {
	c.orphanPublished(ctx, va.Name, publicationOf(va, plan, secrets, uncertain), cause)
	cur, err := c.getVA(va.Name)
	if err != nil {
		return runner.Result{}, err
	}
	_, res, err := c.settleOrphan(ctx, va.Name, cur)
	return res, err
}

// orphanPublished remembers the publication o made for the
// VolumeAttachment name, whose object is gone or replaced (or lost our
// finalizer while being deleted), and writes it to the durable record
// before anything tries to undo it. An orphan already pending under name
// is the same publication (a VolumeAttachment of that name is worked on
// while one is pending only when it publishes the same volume to the same
// node ID, decide.OwnerOnceRecorded; none is worked on before the record
// was read, Run) and is replaced.
// o.uncertain: the publish failed with a code that leaves its outcome
// unknown, so the volume may or may not be published.
func (c *Controller) orphanPublished(ctx context.Context, name string, o orphan, cause error) {
	c.busyMu.Lock()
	_, known := c.orphans[name]
	c.orphans[name] = o
	c.busyMu.Unlock()
	if !known {
		c.exec.metrics.orphanAdded()
	}
	what := "was published"
	if o.uncertain {
		what = "may have been published (ControllerPublish failed with an unknown outcome)"
	}
	msg := fmt.Sprintf("volume %q %s to node %q (node ID %q) for this VolumeAttachment (uid %s), which was deleted or replaced while the driver published it; unpublishing it", o.handle, what, o.nodeName, o.nodeID, o.uid)
	klog.FromContext(ctx).Info("Orphaned publication: VolumeAttachment gone or replaced during ControllerPublish; unpublishing",
		"volumeHandle", o.handle, "nodeID", o.nodeID, "uid", o.uid, "uncertain", o.uncertain, "cause", cause)
	c.exec.recorder.Event(orphanRef(name, o.uid), v1.EventTypeWarning, EventOrphanedPublication, msg)
	c.persistOrphan(ctx, name)
}

// suspectPublished remembers the publication made (or possibly made) for
// va after the status write that would have told whether va still exists
// failed for another reason (a 500, a timeout): the executor's suspect
// hook. The next pass of va's name (the failed write sends it to the
// runner's backoff) settles it from a live read (confirmSuspect) before
// anything else: if va is gone by then, the publication is an orphan,
// although va's key may find nothing left in the cache.
func (c *Controller) suspectPublished(ctx context.Context, va *storagev1.VolumeAttachment, plan decide.AttachPlan, secrets map[string]string, cause error, uncertain bool) {
	c.busyMu.Lock()
	c.suspects[va.Name] = publicationOf(va, plan, secrets, uncertain)
	c.busyMu.Unlock()
	klog.FromContext(ctx).Info("Status write after ControllerPublish failed; whether the VolumeAttachment still exists is checked on the next pass",
		"volumeHandle", plan.Volume.Handle, "nodeID", plan.NodeID, "uid", va.UID, "uncertain", uncertain, "cause", cause)
}

// confirmSuspect settles the publication remembered under name by
// suspectPublished: a live read of the VolumeAttachment decides
// (decide.PublishedForGone) whether it is an orphan or whether a detach
// of ours will come for it. A failed read keeps it, and the caller
// retries.
func (c *Controller) confirmSuspect(ctx context.Context, name string) error {
	c.busyMu.Lock()
	s, ok := c.suspects[name]
	c.busyMu.Unlock()
	if !ok {
		return nil
	}
	live, err := c.exec.client.StorageV1().VolumeAttachments().Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		live = nil
	case err != nil:
		return fmt.Errorf("read VolumeAttachment %q to learn whether volume %q published to node ID %q for it (uid %s) is orphaned: %w", name, s.handle, s.nodeID, s.uid, err)
	}
	c.busyMu.Lock()
	if p, ok := c.suspects[name]; ok && p.same(s) {
		delete(c.suspects, name)
	}
	c.busyMu.Unlock()
	if decide.PublishedForGone(live, s.uid, c.cfg.Driver.Name) {
		c.orphanPublished(ctx, name, s, fmt.Errorf("VolumeAttachment %q (uid %s) is gone, replaced, or lost our finalizer", name, s.uid))
		return nil
	}
	c.publicationSettled(s)
	return nil
}

// persistOrphan writes the orphan of name to the durable record when it is
// not there yet. A failure is reported (error log, event, metric) and the
// orphan stays in memory; the next attempt writes it again.
func (c *Controller) persistOrphan(ctx context.Context, name string) {
	c.busyMu.Lock()
	o, ok := c.orphans[name]
	c.busyMu.Unlock()
	if !ok || o.recorded || o.unpublished || c.records == nil {
		return
	}
	if err := c.records.Put(ctx, recordOf(name, o)); err != nil {
		c.exec.metrics.orphanRecordError("put")
		klog.FromContext(ctx).Error(err, "Could not record the orphaned publication; it is kept in memory only and is lost if the attacher restarts before it is unpublished",
			"volumeAttachment", klog.KRef("", name), "volumeHandle", o.handle, "nodeID", o.nodeID)
		c.exec.recorder.Event(orphanRef(name, o.uid), v1.EventTypeWarning, EventOrphanRecordFailed,
			fmt.Sprintf("could not record that volume %q must be unpublished from node ID %q: %v", o.handle, o.nodeID, err))
		return
	}
	c.updateOrphan(name, o, func(p *orphan) { p.recorded = true })
}

// updateOrphan applies f to the orphan of name if it is still o.
func (c *Controller) updateOrphan(name string, o orphan, f func(*orphan)) {
	c.busyMu.Lock()
	defer c.busyMu.Unlock()
	if p, ok := c.orphans[name]; ok && p.same(o) {
		f(&p)
		c.orphans[name] = p
	}
}

// dropOrphan forgets the orphan o of name, removing its durable record
// first (only while the record still holds o: a newer orphan of the same
// name, recorded meanwhile, keeps its record); on error it stays (marked
// unpublished when it was) and the caller retries.
func (c *Controller) dropOrphan(ctx context.Context, name string, o orphan) error {
	if o.recorded && c.records != nil {
		if err := c.records.Delete(ctx, recordOf(name, o)); err != nil {
			c.exec.metrics.orphanRecordError("delete")
			return fmt.Errorf("remove the orphaned publication of volume %q on node ID %q from the record: %w", o.handle, o.nodeID, err)
		}
	}
	c.busyMu.Lock()
	p, ok := c.orphans[name]
	if ok && p.same(o) {
		delete(c.orphans, name)
	}
	c.busyMu.Unlock()
	if ok && p.same(o) {
		c.exec.metrics.orphanDropped()
		c.publicationSettled(o)
	}
	return nil
}

// publicationSettled wakes what may have waited for the orphan or suspect
// o: the PV it was published from (its finalizer, syncPV) and the
// VolumeAttachments of that PV that are not attached yet (a publish to
// another node, decide.PublishBlockedByOrphan), which would otherwise wait
// out their backoff.
func (c *Controller) publicationSettled(o orphan) {
	if o.pvName == "" {
		return
	}
	c.pvs.Enqueue(o.pvName)
	objs, _ := c.vaInformer.GetIndexer().ByIndex(vaByPVIndex, o.pvName)
	for _, obj := range objs {
		if va, ok := c.ours(obj); ok && !va.Status.Attached && va.DeletionTimestamp == nil && va.Name != o.name {
			c.attach.ForgetAndEnqueue(va.Name)
		}
	}
}

// pending returns every orphan not yet unpublished and every suspect, by
// VolumeAttachment name, for decide.PublishBlockedByOrphan.
func (c *Controller) pending() []decide.Orphan {
	c.busyMu.Lock()
	defer c.busyMu.Unlock()
	if len(c.orphans) == 0 && len(c.suspects) == 0 {
		return nil
	}
	var out []decide.Orphan
	for _, name := range slices.Sorted(maps.Keys(c.orphans)) {
		if o := c.orphans[name]; !o.unpublished {
			out = append(out, o.facts())
		}
	}
	for _, name := range slices.Sorted(maps.Keys(c.suspects)) {
		f := c.suspects[name].facts()
		f.Suspect = true
		out = append(out, f)
	}
	return out
}

// orphanHoldsPV reports whether a pending orphan (or a publication whose
// VolumeAttachment's fate is not known yet) may still have pv's volume
// published: our PV finalizer stays until it is undone.
func (c *Controller) orphanHoldsPV(pv *v1.PersistentVolume) bool {
	c.busyMu.Lock()
	defer c.busyMu.Unlock()
	for _, m := range []map[string]orphan{c.orphans, c.suspects} {
		for _, o := range m {
			if decide.OrphanHoldsPV(o.facts(), pv, c.cfg.Driver.Name) {
				return true
			}
		}
	}
	return false
}

// hasOrphan reports whether a publication is pending under name.
func (c *Controller) hasOrphan(name string) bool {
	c.busyMu.Lock()
	defer c.busyMu.Unlock()
	_, ok := c.orphans[name]
	return ok
}

// settleOrphan undoes the publication left under name, if any, before the
// VolumeAttachment of that name now in the cache (va, nil when none) is
// worked on. A VolumeAttachment of ours that carries our finalizer and
// records the same volume and node ID takes the publication over (its
// detach will undo it); a new one of that name that will publish the same
// volume to the same node ID but has no finalizer yet is worked on while
// the orphan stays, until its finalizer has landed (syncAttach settles
// again after its pass). cont tells the caller whether to go on with va:
// not when the orphan is still pending, nor when va is the very object the
// publication was made for (gone, with a stale cache whose delete event
// comes later, or deleting without our finalizer).
func (c *Controller) settleOrphan(ctx context.Context, name string, va *storagev1.VolumeAttachment) (cont bool, res runner.Result, err error) {
	if err := c.confirmSuspect(ctx, name); err != nil {
		return false, runner.Result{}, err
	}
	c.busyMu.Lock()
	o, ok := c.orphans[name]
	c.busyMu.Unlock()
	if !ok {
		return true, runner.Result{}, nil
	}
	logger := klog.FromContext(ctx).WithValues("volumeAttachment", klog.KRef("", name), "volumeHandle", o.handle, "nodeID", o.nodeID)
	stale := va != nil && va.UID == o.uid
	if o.unpublished {
		if err := c.dropOrphan(ctx, name, o); err != nil {
			return false, runner.Result{}, err
		}
		return !stale, runner.Result{}, nil
	}
	owner, waitFor := "", ""
	if va != nil && !stale {
		switch c.ownership(va, o) {
		case decide.Owner:
			owner = va.Name
		case decide.OwnerOnceRecorded:
			logger.V(2).Info("Orphaned publication kept until the VolumeAttachment for the same volume and node carries our finalizer")
			return true, runner.Result{}, nil
		}
	}
	if owner == "" {
		owner, waitFor = c.otherOwner(name, o)
	}
	if owner != "" {
		if err := c.dropOrphan(ctx, name, o); err != nil {
			return false, runner.Result{}, err
		}
		logger.Info("Orphaned publication taken over by a VolumeAttachment for the same volume and node", "owner", owner)
		return !stale, runner.Result{}, nil
	}
	if waitFor != "" {
		// Unpublishing now could take the volume from it as soon as it
		// publishes; dropping the orphan would leak it should that
		// VolumeAttachment go before its finalizer lands.
		return false, runner.Result{}, fmt.Errorf("orphaned publication of volume %q on node ID %q left by VolumeAttachment %q waits for VolumeAttachment %q, which publishes the same volume to that node, to carry our finalizer",
			o.handle, o.nodeID, name, waitFor)
	}

	c.persistOrphan(ctx, name)
	out, err := c.exec.unpublish(ctx, unpublication{handle: o.handle, nodeID: o.nodeID, secretRef: o.secretRef, secrets: o.secrets})
	switch {
	case errors.Is(err, errNoSlot):
		return false, runner.Result{}, err
	case err == nil && out.blocked != nil:
		err = fmt.Errorf("%s", out.blocked.Message)
	}
	if err != nil {
		c.showOrphanWait(ctx, va, o, err)
		return false, runner.Result{}, fmt.Errorf("unpublish volume %q from node ID %q left behind by VolumeAttachment %q: %w", o.handle, o.nodeID, name, err)
	}
	if out.callErr != nil {
		if o.uncertain && !decide.StillUncertain(o.facts(), csi.IsFinalError(out.callErr)) {
			// The driver answered with no publish pending: from now on a
			// listing that does not show the volume may forget it.
			c.updateOrphan(name, o, func(p *orphan) { p.uncertain = false })
		}
		c.showOrphanWait(ctx, va, o, out.callErr)
		return false, runner.Result{}, fmt.Errorf("unpublish volume %q from node ID %q left behind by the deleted VolumeAttachment %q: %w", o.handle, o.nodeID, name, out.callErr)
	}
	c.updateOrphan(name, o, func(p *orphan) { p.unpublished = true })
	o.unpublished = true
	logger.Info("Unpublished the volume of a VolumeAttachment deleted or replaced while it was being published")
	if err := c.dropOrphan(ctx, name, o); err != nil {
		return false, runner.Result{}, err
	}
	return !stale, runner.Result{}, nil
}

// showOrphanWait tells the user of va, a new VolumeAttachment that waits
// for the orphan o left under its name to be unpublished, why it waits:
// status.attachError and a Warning AttachFailed event, written only when
// the message changes (the error code field stays empty: it is not an
// error of va's own publish). The normal attach overwrites it once the
// orphan is settled. A failure to write is logged; the caller's error
// (the failed unpublish) drives the retry either way.
func (c *Controller) showOrphanWait(ctx context.Context, va *storagev1.VolumeAttachment, o orphan, cause error) {
	if va == nil || va.UID == o.uid || va.DeletionTimestamp != nil {
		return
	}
	msg := fmt.Sprintf("waiting for the publication of volume %q on node ID %q, left by a deleted VolumeAttachment of the same name (uid %s), to be unpublished; last unpublish error: %v",
		o.handle, o.nodeID, o.uid, cause)
	if err := c.exec.recordError(ctx, va, true, msg, nil); err != nil {
		klog.FromContext(ctx).Error(err, "Could not show on the VolumeAttachment that it waits for an orphaned publication",
			"volumeAttachment", klog.KObj(va), "volumeHandle", o.handle, "nodeID", o.nodeID)
	}
}

// ownership is how va relates to the orphan o (decide.OrphanOwner).
func (c *Controller) ownership(va *storagev1.VolumeAttachment, o orphan) decide.Ownership {
	obs, err := c.observe(va)
	if err != nil {
		return decide.NotOwner
	}
	return decide.OrphanOwner(obs, c.cfg.Driver, bindTranslator(c.tr, klog.Background()), o.facts())
}

// otherOwner returns the name of another VolumeAttachment of ours for the
// same volume and node ID that owns the publication (owner: unpublishing
// would take the volume away from it), or of one that will own it once its
// finalizer lands (waitFor); both "" when none.
func (c *Controller) otherOwner(name string, o orphan) (owner, waitFor string) {
	if o.nodeName == "" {
		return "", ""
	}
	objs, err := c.vaInformer.GetIndexer().ByIndex(vaByNodeIndex, o.nodeName)
	if err != nil {
		return "", ""
	}
	for _, obj := range objs {
		va, ok := c.ours(obj)
		if !ok || va.Name == name {
			continue
		}
		switch c.ownership(c.vaCache.Resolve(va), o) {
		case decide.Owner:
			return va.Name, ""
		case decide.OwnerOnceRecorded:
			waitFor = va.Name
		}
	}
	return "", waitFor
}

// orphanRef is what events about the orphan of name point at: the
// VolumeAttachment the volume was published for.
func orphanRef(name string, uid types.UID) *storagev1.VolumeAttachment {
	return &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: name, UID: uid}}
}

// loadOrphansOnce reads the durable record and queues every orphan it
// holds; false when the read failed (reported; loadOrphans retries).
func (c *Controller) loadOrphansOnce(ctx context.Context) bool {
	if c.records == nil {
		return true
	}
	recs, err := c.records.Load(ctx)
	var invalid *invalidRecordsError
	if errors.As(err, &invalid) {
		// Unreadable entries cannot be unpublished; the valid ones are
		// loaded and attaches go on. Someone must look at them.
		c.exec.metrics.orphanRecordError("load")
		klog.FromContext(ctx).Error(err, "Ignoring entries of the orphaned-publication record that are not valid records; repair or remove them by hand", "entries", invalid.keys)
		err = nil
	}
	if err != nil {
		c.exec.metrics.orphanRecordError("load")
		klog.FromContext(ctx).Error(err, "Could not read the orphaned publications an earlier attacher recorded; no VolumeAttachment is attached until it can be read; retrying")
		return false
	}
	c.adoptRecords(ctx, recs)
	return true
}

// loadOrphans retries loadOrphansOnce with backoff until it succeeds
// (true) or ctx is done (false).
func (c *Controller) loadOrphans(ctx context.Context) bool {
	delay := c.cfg.RetryIntervalStart
	if delay <= 0 {
		delay = time.Second
	}
	for !c.loadOrphansOnce(ctx) {
		select {
		case <-ctx.Done():
			return false
		case <-c.clock.After(delay):
		}
		delay = min(2*delay, max(c.cfg.RetryIntervalMax, delay))
	}
	return true
}

func (c *Controller) adoptRecords(ctx context.Context, recs map[string]orphanRecord) {
	for _, name := range slices.Sorted(maps.Keys(recs)) {
		rec := recs[name]
		c.busyMu.Lock()
		_, known := c.orphans[name]
		if !known {
			c.orphans[name] = fromRecord(rec)
		}
		c.busyMu.Unlock()
		if known {
			continue
		}
		c.exec.metrics.orphanAdded()
		klog.FromContext(ctx).Info("Orphaned publication recorded by an earlier attacher; unpublishing",
			"volumeAttachment", klog.KRef("", name), "volumeHandle", rec.VolumeHandle, "nodeID", rec.NodeID, "uid", rec.UID)
		c.attach.Enqueue(name)
	}
}

// orphanSnapshot copies the pending orphans, for the ListVolumes reconcile.
func (c *Controller) orphanSnapshot() map[string]orphan {
	c.busyMu.Lock()
	defer c.busyMu.Unlock()
	return maps.Clone(c.orphans)
}

// dropUnlisted forgets the orphans (pending before the listing began) that
// the driver no longer reports published on their node: nothing is left to
// undo. Not an orphan whose publish may still be under way
// (decide.ForgetUnlisted).
func (c *Controller) dropUnlisted(ctx context.Context, before map[string]orphan, published map[string][]string) {
	for name, o := range before {
		if !decide.ForgetUnlisted(o.facts(), slices.Contains(published[o.handle], o.nodeID)) {
			continue
		}
		if err := c.dropOrphan(ctx, name, o); err != nil {
			klog.FromContext(ctx).Error(err, "Drop orphaned publication the driver no longer lists", "volumeAttachment", klog.KRef("", name))
			continue
		}
		klog.FromContext(ctx).Info("Orphaned publication no longer listed by the driver; forgotten",
			"volumeAttachment", klog.KRef("", name), "volumeHandle", o.handle, "nodeID", o.nodeID)
	}
}
