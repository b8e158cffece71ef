package attacher

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
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
	// EventOrphanRecordIgnored is recorded on the ConfigMap of the
	// record: one of its entries is not acted on (decide.SettleOrphan).
	EventOrphanRecordIgnored = "OrphanRecordIgnored"
	// EventOrphanRecordAvailable (Normal) is recorded on the Lease when
	// the record can be read or watched again after an
	// EventOrphanRecordFailed there: latchctl's finding ends with it.
	EventOrphanRecordAvailable = "OrphanRecordAvailable"
)

// ledger owns, under one lock, the publications that may be on a node
// without a VolumeAttachment of ours standing for them — orphans (their
// VolumeAttachment is gone or replaced), suspects (whether it is, a live
// read is still to tell) and publishes in flight — and the entries of the
// durable record the Controller is done with. Nothing else touches them;
// each method is one critical section that calls out to nothing, so the
// lock orders with no other.
type ledger struct {
	mu sync.Mutex
	// orphans by VolumeAttachment name.
	orphans map[string]orphan
	// publishing holds the publications whose ControllerPublish is in
	// flight, by VA name, until the pass that makes it ends (by then the
	// publication is recorded on its VolumeAttachment, an orphan or a
	// suspect): a publish of the same single-node volume to another node
	// ID waits for it (decideAttach).
	publishing map[string]orphan
	// suspects holds publications whose VolumeAttachment's status write
	// failed for a reason that does not tell whether the object still
	// exists, by VA name, until the next pass of that name reads it
	// (confirmSuspect).
	suspects map[string]orphan
	// finished holds the entries of the record the Controller is done
	// with, by name, so that reading the record again adopts none of them
	// a second time (orphanrecord.go).
	finished map[string]finishedEntry
	// stillPublished holds the deleting VolumeAttachments without our
	// finalizer that the last ListVolumes reconcile found still published
	// on their node, by name and UID: the detach pass unpublishes them
	// (decide.Observed.StillPublished). Each reconcile replaces the set,
	// so a VA that is gone or no longer listed drops out; a successful
	// unpublish drops it at once.
	stillPublished map[string]types.UID
}

func newLedger() *ledger {
	return &ledger{orphans: map[string]orphan{}, publishing: map[string]orphan{}, suspects: map[string]orphan{}, finished: map[string]finishedEntry{}}
}

// setStillPublished replaces the set of deleting VolumeAttachments
// without our finalizer that the driver still lists as published.
func (l *ledger) setStillPublished(m map[string]types.UID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stillPublished = m
}

// isStillPublished reports whether the last listing found va (this very
// object) still published.
func (l *ledger) isStillPublished(va *storagev1.VolumeAttachment) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	uid, ok := l.stillPublished[va.Name]
	return ok && uid == va.UID
}

// stillPublishedDone drops va once its unpublish succeeded.
func (l *ledger) stillPublishedDone(va *storagev1.VolumeAttachment) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if uid, ok := l.stillPublished[va.Name]; ok && uid == va.UID {
		delete(l.stillPublished, va.Name)
	}
}

// get returns the orphan of name.
func (l *ledger) get(name string) (orphan, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	o, ok := l.orphans[name]
	return o, ok
}

// has reports whether a publication is pending under name.
func (l *ledger) has(name string) bool {
	_, ok := l.get(name)
	return ok
}

// put makes o the orphan of name and reports whether one was known.
func (l *ledger) put(name string, o orphan) (known bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, known = l.orphans[name]
	l.orphans[name] = o
	return known
}

// update applies f to the orphan of name if it is still o.
func (l *ledger) update(name string, o orphan, f func(*orphan)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p, ok := l.orphans[name]; ok && p.same(o) {
		f(&p)
		l.orphans[name] = p
	}
}

// drop forgets the orphan of name if it is still o (dropped tells), and
// records done as a finished entry of the record when given.
func (l *ledger) drop(name string, o orphan, done *finishedEntry) (dropped bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p, ok := l.orphans[name]; ok && p.same(o) {
		delete(l.orphans, name)
		dropped = true
	}
	if done != nil {
		l.finished[name] = *done
	}
	return dropped
}

// snapshot copies the orphans.
func (l *ledger) snapshot() map[string]orphan {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.orphans)
}

// putSuspect remembers o as a suspect.
func (l *ledger) putSuspect(o orphan) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.suspects[o.name] = o
}

// suspect returns the suspect of name.
func (l *ledger) suspect(name string) (orphan, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s, ok := l.suspects[name]
	return s, ok
}

// dropSuspect forgets the suspect of name if it is still s.
func (l *ledger) dropSuspect(name string, s orphan) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p, ok := l.suspects[name]; ok && p.same(s) {
		delete(l.suspects, name)
	}
}

// decide runs decideFn on the pending publications of handle (none when
// !ofHandle: the attach resolves no volume; pendingLocked) and registers
// the publish it returns (nil: none) as in flight in the same critical
// section: of two passes for the same single-node volume on two node IDs,
// the later one sees the earlier one's publish. done ends the
// registration.
func (l *ledger) decide(handle string, ofHandle bool, decideFn func(pending []decide.Orphan) (decide.AttachPlan, *orphan)) (plan decide.AttachPlan, done func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var pending []decide.Orphan
	if ofHandle {
		pending = l.pendingLocked(func(o orphan) bool { return o.handle == handle })
	}
	plan, p := decideFn(pending)
	if p == nil {
		return plan, func() {}
	}
	l.publishing[p.name] = *p
	return plan, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if q, ok := l.publishing[p.name]; ok && q.same(*p) {
			delete(l.publishing, p.name)
		}
	}
}

// pending returns every pending publication (pendingLocked).
func (l *ledger) pending() []decide.Orphan {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pendingLocked(func(orphan) bool { return true })
}

// pendingLocked returns every orphan not yet unpublished, every suspect
// and every publish in flight that keep accepts, each kind by
// VolumeAttachment name, for decide.PublishBlockedByOrphan. An attach pass
// asks for one handle's (decide.PublishHandle): up to --worker-threads
// publishes are in flight, and copying and sorting all of them on every
// pass cost about 46 µs and 44 kB with 100 (BenchmarkLedgerDecide). The
// caller holds mu.
func (l *ledger) pendingLocked(keep func(orphan) bool) []decide.Orphan {
	var out []decide.Orphan
	add := func(m map[string]orphan, skip func(orphan) bool, mark func(*decide.Orphan)) {
		var names []string
		for name, o := range m {
			if keep(o) && !skip(o) {
				names = append(names, name)
			}
		}
		slices.Sort(names)
		for _, name := range names {
			f := m[name].facts()
			mark(&f)
			out = append(out, f)
		}
	}
	add(l.orphans, func(o orphan) bool { return o.unpublished }, func(*decide.Orphan) {})
	add(l.suspects, func(orphan) bool { return false }, func(f *decide.Orphan) { f.Suspect = true })
	add(l.publishing, func(orphan) bool { return false }, func(f *decide.Orphan) { f.Publishing = true })
	return out
}

// anyHolds reports whether an orphan or a suspect satisfies holds.
func (l *ledger) anyHolds(holds func(decide.Orphan) bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range []map[string]orphan{l.orphans, l.suspects} {
		for _, o := range m {
			if holds(o.facts()) {
				return true
			}
		}
	}
	return false
}

// adopt takes the entry rec of the record, as o, under name unless the
// record's entry is finished already (done, with its finished entry f) or
// an orphan is pending under name (known); an entry that cannot be acted
// on (usable false) is marked finished instead.
func (l *ledger) adopt(name string, rec orphanRecord, o orphan, usable bool) (f finishedEntry, done, known bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	f, done = l.finished[name]
	done = done && sameRecord(f.rec, rec)
	_, known = l.orphans[name]
	switch {
	case !done && !known && usable:
		l.orphans[name] = o
	case !done && !known:
		l.finished[name] = finishedEntry{rec: rec}
	}
	return f, done, known
}

// forgetFinished forgets the finished entries recs no longer holds.
func (l *ledger) forgetFinished(recs map[string]orphanRecord) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for name := range l.finished {
		if _, ok := recs[name]; !ok {
			delete(l.finished, name)
		}
	}
}

// removed notes that the finished entry rec is gone from the record.
func (l *ledger) removed(rec orphanRecord) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if f, ok := l.finished[rec.VolumeAttachment]; ok && sameRecord(f.rec, rec) {
		f.removeFailed = false
		l.finished[rec.VolumeAttachment] = f
	}
}

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
	// fromRecord: read from the ConfigMap record, not witnessed by this
	// process: acted on only as far as the API server and the driver
	// corroborate it (decide.SettleOrphan). Its secretRef is never read.
	fromRecord bool
	// listed: a ListVolumes listing showed the volume published on nodeID
	// since the orphan was known.
	listed bool
	// recordErr says why the orphan could not be recorded ("" when it
	// was, or was not tried yet): shown to a VolumeAttachment that waits
	// for it (showOrphanWait).
	recordErr string
}

func (o orphan) same(p orphan) bool {
	return o.uid == p.uid && o.handle == p.handle && o.nodeID == p.nodeID
}

// facts is what package decide's orphan decisions need of o.
func (o orphan) facts() decide.Orphan {
	return decide.Orphan{Handle: o.handle, NodeID: o.nodeID, VA: o.name, NodeName: o.nodeName, UID: o.uid,
		PV: o.pvName, Uncertain: o.uncertain, SingleNode: o.singleNode, FromRecord: o.fromRecord, RecordProblem: o.recordErr}
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

// afterAttach settles what the executor's attach left for the orphan
// bookkeeping (out.published) and returns the pass's result.
func (c *Controller) afterAttach(ctx context.Context, out attachOutcome) (runner.Result, error) {
	p := out.published
	switch {
	case p == nil:
		return out.res, out.err
	case p.gone:
		return c.publishedForGone(ctx, p.o, p.cause)
	}
	c.suspectPublished(ctx, p.o, p.cause)
	return out.res, out.err
}

// publishedForGone makes the publication o (o.uncertain: possible
// publication), made for a VolumeAttachment that is gone or replaced, an
// orphan and tries to undo it at once; while that fails, the attach lane
// retries it under the VolumeAttachment's name before any VolumeAttachment
// of that name is worked on.
func (c *Controller) publishedForGone(ctx context.Context, o orphan, cause error) (runner.Result, error) {
	c.orphanPublished(ctx, o.name, o, cause)
	cur, err := c.getVA(o.name)
	if err != nil {
		return runner.Result{}, err
	}
	_, res, err := c.settleOrphan(ctx, o.name, cur)
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
	if known := c.orphans.put(name, o); !known {
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

// suspectPublished remembers the publication o made (or possibly made)
// for a VolumeAttachment after the status write that would have told
// whether it still exists failed for another reason (a 500, a timeout).
// The next pass of its name (the failed write sends it to the runner's
// backoff) settles it from a live read (confirmSuspect) before anything
// else: if the object is gone by then, the publication is an orphan,
// although the key may find nothing left in the cache.
func (c *Controller) suspectPublished(ctx context.Context, o orphan, cause error) {
	c.orphans.putSuspect(o)
	klog.FromContext(ctx).Info("Status write after ControllerPublish failed; whether the VolumeAttachment still exists is checked on the next pass",
		"volumeHandle", o.handle, "nodeID", o.nodeID, "uid", o.uid, "uncertain", o.uncertain, "cause", cause)
}

// confirmSuspect settles the publication remembered under name by
// suspectPublished: a live read of the VolumeAttachment decides
// (decide.PublishedForGone) whether it is an orphan or whether a detach
// of ours will come for it. A failed read keeps it, and the caller
// retries.
func (c *Controller) confirmSuspect(ctx context.Context, name string) error {
	s, ok := c.orphans.suspect(name)
	if !ok {
		return nil
	}
	live, err := c.exec.readVA(ctx, name)
	if err != nil {
		return fmt.Errorf("read VolumeAttachment %q to learn whether volume %q published to node ID %q for it (uid %s) is orphaned: %w", name, s.handle, s.nodeID, s.uid, err)
	}
	c.orphans.dropSuspect(name, s)
	if decide.PublishedForGone(live, s.uid, c.cfg.Driver.Name) {
		c.orphanPublished(ctx, name, s, fmt.Errorf("VolumeAttachment %q (uid %s) is gone, replaced, or lost our finalizer", name, s.uid))
		return nil
	}
	c.publicationSettled(s)
	return nil
}

// updateOrphan applies f to the orphan of name if it is still o.
func (c *Controller) updateOrphan(name string, o orphan, f func(*orphan)) {
	c.orphans.update(name, o, f)
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

// decideAttach decides the attach of obs.VA (decide.Attach) against every
// publication that may be on a node without a VolumeAttachment of ours
// standing for it, and registers a publish the plan makes as in flight in
// the same critical section of the ledger: of two passes for the same
// single-node volume on two node IDs, the later one sees the earlier one's
// publish, however the earlier VolumeAttachment fares meanwhile (a
// force-delete during the call leaves no object to see). done ends the
// registration; call it once the pass settled the executor's outcome, when
// the publication is recorded on its VolumeAttachment, an orphan or a
// suspect.
func (c *Controller) decideAttach(ctx context.Context, obs decide.Observed) (plan decide.AttachPlan, done func()) {
	tr := translator(ctx)
	handle, ok := decide.PublishHandle(obs, c.cfg.Driver, tr)
	return c.orphans.decide(handle, ok, func(pending []decide.Orphan) (decide.AttachPlan, *orphan) {
		obs.Pending = pending
		plan := decide.Attach(obs, c.cfg.Driver, tr)
		if !plan.Publish {
			return plan, nil
		}
		p := publicationOf(obs.VA, plan, nil, true)
		return plan, &p
	})
}

// pending returns every publication a publish may wait for
// (ledger.pendingLocked).
func (c *Controller) pending() []decide.Orphan { return c.orphans.pending() }

// orphanHoldsPV reports whether a pending orphan (or a publication whose
// VolumeAttachment's fate is not known yet) may still have pv's volume
// published: our PV finalizer stays until it is undone.
func (c *Controller) orphanHoldsPV(pv *v1.PersistentVolume) bool {
	return c.orphans.anyHolds(func(o decide.Orphan) bool { return decide.OrphanHoldsPV(o, pv, c.cfg.Driver.Name) })
}

// hasOrphan reports whether a publication is pending under name.
func (c *Controller) hasOrphan(name string) bool { return c.orphans.has(name) }

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
	o, ok := c.orphans.get(name)
	if !ok {
		return true, runner.Result{}, nil
	}
	logger := klog.FromContext(ctx).WithValues("volumeAttachment", klog.KRef("", name), "volumeHandle", o.handle, "nodeID", o.nodeID)
	// va is the very object the publication was made for: gone by the
	// API server's word, with a cache that lags, or deleting without our
	// finalizer. Only for a publication this process saw made: an entry
	// of the record proves nothing about the object it names.
	stale := va != nil && va.UID == o.uid && !o.fromRecord
	if o.unpublished {
		c.dropOrphan(ctx, name, o)
		return !stale, runner.Result{}, nil
	}
	cl := c.claimOf(ctx, name, va, o, stale)
	switch decide.SettleOrphan(o.facts(), decide.Corroboration{Claim: cl.ownership, CanList: c.canList(), Listed: o.listed}) {
	case decide.OrphanIgnored:
		c.ignoreOrphan(ctx, name, o, decide.RecordedOrphanUnusable(o.facts()))
		return !stale, runner.Result{}, nil
	case decide.OrphanTakenOver:
		c.dropOrphan(ctx, name, o)
		if o.fromRecord && (cl.by != name || cl.uid == o.uid) {
			// The entry says a publication that a VolumeAttachment of
			// ours stands for is orphaned: not something csi-attacher
			// writes.
			c.warnRecordEntry(ctx, name, o, fmt.Sprintf("VolumeAttachment %q (uid %s), which carries our finalizer, claims the publication of volume %q on node ID %q; the entry was dropped without an unpublish",
				cl.by, cl.uid, o.handle, o.nodeID))
		}
		logger.Info("Orphaned publication taken over by a VolumeAttachment for the same volume and node", "owner", cl.by)
		return !stale, runner.Result{}, nil
	case decide.OrphanWaitForOwner:
		if cl.by == name {
			logger.V(2).Info("Orphaned publication kept until the VolumeAttachment for the same volume and node carries our finalizer")
			return true, runner.Result{}, nil
		}
		// Unpublishing now could take the volume from it as soon as it
		// publishes; dropping the orphan would leak it should that
		// VolumeAttachment go before its finalizer lands.
		return false, runner.Result{}, fmt.Errorf("orphaned publication of volume %q on node ID %q left by VolumeAttachment %q waits for VolumeAttachment %q, which publishes the same volume to that node, to carry our finalizer",
			o.handle, o.nodeID, name, cl.by)
	case decide.OrphanWaitForListing:
		err := fmt.Errorf("the orphaned publication of volume %q on node ID %q, read from ConfigMap %s, is unpublished only once a ListVolumes listing of the driver shows it (every --reconcile-sync); a listing that does not show it forgets it",
			o.handle, o.nodeID, c.recordName())
		c.showOrphanWait(ctx, va, o, err)
		return false, runner.Result{}, err
	}

	c.persistOrphan(ctx, name)
	if p, ok := c.orphans.get(name); ok && p.same(o) {
		o = p // with what the write said
	}
	secretRef := o.secretRef
	if o.fromRecord {
		secretRef = c.recordedSecret(ctx, o)
	}
	callErr, err := c.unpublishOrphan(ctx, o, secretRef)
	if errors.Is(err, errNoSlot) {
		return false, runner.Result{}, err
	}
	if err != nil {
		c.showOrphanWait(ctx, va, o, err)
		return false, runner.Result{}, fmt.Errorf("unpublish volume %q from node ID %q left behind by VolumeAttachment %q: %w", o.handle, o.nodeID, name, err)
	}
	if callErr != nil {
		if o.uncertain && !decide.StillUncertain(o.facts(), csi.IsFinalError(callErr)) {
			// The driver answered with no publish pending: from now on a
			// listing that does not show the volume may forget it.
			c.updateOrphan(name, o, func(p *orphan) { p.uncertain = false })
		}
		c.showOrphanWait(ctx, va, o, callErr)
		return false, runner.Result{}, fmt.Errorf("unpublish volume %q from node ID %q left behind by the deleted VolumeAttachment %q: %w", o.handle, o.nodeID, name, callErr)
	}
	c.updateOrphan(name, o, func(p *orphan) { p.unpublished = true })
	o.unpublished = true
	logger.Info("Unpublished the volume of a VolumeAttachment deleted or replaced while it was being published")
	c.dropOrphan(ctx, name, o)
	return !stale, runner.Result{}, nil
}

// unpublishOrphan calls ControllerUnpublish for o with the secret values
// its publish used, or else those read through secretRef, when
// decide.BeforeCall allows the call (a missing or forbidden Secret is
// returned as err, as is a failed read or the wait for a slot: errNoSlot).
// callErr is the driver's error.
func (c *Controller) unpublishOrphan(ctx context.Context, o orphan, secretRef *v1.SecretReference) (callErr, err error) {
	secrets := o.secrets
	if secrets == nil {
		var facts decide.CallFacts
		if secrets, facts, err = c.exec.readSecret(ctx, secretRef); err != nil {
			return nil, err
		}
		if blocked := decide.BeforeCall(facts); blocked != nil {
			return nil, fmt.Errorf("%s", blocked.Message)
		}
	}
	return c.exec.unpublish(ctx, unpublication{handle: o.handle, nodeID: o.nodeID, secrets: secrets})
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
	msg := fmt.Sprintf("waiting for the publication of volume %q on node ID %q, left by a deleted VolumeAttachment of the same name (uid %s), to be unpublished",
		o.handle, o.nodeID, o.uid)
	if o.recordErr != "" {
		// Before the driver's error, which may be long: a message over
		// the API server's limit is cut at its end.
		msg += "; it is tracked in memory only, and lost if csi-attacher restarts before the unpublish succeeds: " + o.recordErr
	}
	msg += fmt.Sprintf("; last unpublish error: %v", cause)
	if err := c.exec.recordError(ctx, va, true, msg, nil); err != nil {
		klog.FromContext(ctx).Error(err, "Could not show on the VolumeAttachment that it waits for an orphaned publication",
			"volumeAttachment", klog.KObj(va), "volumeHandle", o.handle, "nodeID", o.nodeID)
	}
}

// ownership is how va relates to the orphan o (decide.OrphanOwner).
func (c *Controller) ownership(ctx context.Context, va *storagev1.VolumeAttachment, o orphan) decide.Ownership {
	obs, err := c.observe(va)
	if err != nil {
		return decide.NotOwner
	}
	return decide.OrphanOwner(obs, c.cfg.Driver, translator(ctx), o.facts())
}

// claim is the strongest relation of a VolumeAttachment of ours to an
// orphan's publication (decide.OrphanOwner), and which one it is.
type claim struct {
	ownership decide.Ownership
	by        string
	uid       types.UID
}

// claimOf finds what claims the publication of the orphan o of name: va
// (the VolumeAttachment of that name now, nil when none; left out when
// stale, the very object the publication was made for), then every other
// VolumeAttachment of ours that records o's node ID or runs on a node
// whose CSINode reports it (or on the node o names). A VolumeAttachment of
// name that will own it once its finalizer lands comes first among those
// that will; any owner comes before them.
func (c *Controller) claimOf(ctx context.Context, name string, va *storagev1.VolumeAttachment, o orphan, stale bool) claim {
	var best claim
	consider := func(v *storagev1.VolumeAttachment) bool {
		switch c.ownership(ctx, v, o) {
		case decide.Owner:
			best = claim{ownership: decide.Owner, by: v.Name, uid: v.UID}
			return true
		case decide.OwnerOnceRecorded:
			if best.ownership == decide.NotOwner {
				best = claim{ownership: decide.OwnerOnceRecorded, by: v.Name, uid: v.UID}
			}
		}
		return false
	}
	if va != nil && !stale && consider(va) {
		return best
	}
	for _, other := range c.claimCandidates(name, o) {
		// Read again through the overlay: the index may hold a version
		// our own write replaced (kube.OverlaidStore.Get).
		v, ok, err := c.vaCache.Get(other.Name)
		if err != nil || !ok {
			continue
		}
		if consider(v) {
			return best
		}
	}
	return best
}

// claimCandidates returns the VolumeAttachments of ours other than name
// that may claim o's publication: those whose node-id annotation is o's
// node ID (every one that carries our finalizer records it), and those on
// the nodes whose CSINode reports that node ID for our driver, or on the
// node o names (those may publish it once their finalizer lands). The
// node name of an entry read from the record is not trusted to find them.
func (c *Controller) claimCandidates(name string, o orphan) []*storagev1.VolumeAttachment {
	seen := map[string]bool{name: true}
	var out []*storagev1.VolumeAttachment
	add := func(index, value string) {
		objs, err := c.vaInformer.GetIndexer().ByIndex(index, value)
		if err != nil {
			return
		}
		for _, obj := range objs {
			if v, ok := c.ours(obj); ok && !seen[v.Name] {
				seen[v.Name] = true
				out = append(out, v)
			}
		}
	}
	add(vaByNodeIDIndex, o.nodeID)
	nodes := []string{}
	if o.nodeName != "" {
		nodes = append(nodes, o.nodeName)
	}
	if csiNodes, err := c.nodeLister.List(labels.Everything()); err == nil {
		for _, n := range csiNodes {
			if id, ok := decide.CSINodeID(n, c.cfg.Driver.Name); ok && id == o.nodeID && n.Name != o.nodeName {
				nodes = append(nodes, n.Name)
			}
		}
	}
	for _, n := range nodes {
		add(vaByNodeIndex, n)
	}
	return out
}

// canList: the driver lists publications (the ListVolumes reconcile runs),
// so an entry of the record waits for a listing to show it.
func (c *Controller) canList() bool { return c.cfg.ReconcileSync > 0 && !c.cfg.Trivial }

// recordedSecret is the controller-publish secret an unpublish of the
// recorded orphan o uses: the one its PersistentVolume names now
// (decide.RecordedOrphanSecret), never the entry's secretRef.
func (c *Controller) recordedSecret(ctx context.Context, o orphan) *v1.SecretReference {
	if o.pvName == "" {
		return nil
	}
	pv, err := c.getPV(o.pvName)
	if err != nil {
		return nil
	}
	return decide.RecordedOrphanSecret(o.facts(), pv, c.cfg.Driver, translator(ctx))
}

// orphanRef is what events about the orphan of name point at: the
// VolumeAttachment the volume was published for.
func orphanRef(name string, uid types.UID) *storagev1.VolumeAttachment {
	return &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: name, UID: uid}}
}

// orphanSnapshot copies the pending orphans, for the ListVolumes reconcile.
func (c *Controller) orphanSnapshot() map[string]orphan { return c.orphans.snapshot() }

// dropUnlisted forgets the orphans (pending before the listing began) that
// the driver no longer reports published on their node: nothing is left to
// undo. Not an orphan whose publish may still be under way
// (decide.ForgetUnlisted).
//
// The orphans it shows published are marked listed: an entry of the record
// waits for that before it is unpublished (decide.SettleOrphan), and goes
// on now.
func (c *Controller) dropUnlisted(ctx context.Context, before map[string]orphan, published map[string][]string) {
	for name, o := range before {
		listed := slices.Contains(published[o.handle], o.nodeID)
		if listed && !o.listed {
			c.updateOrphan(name, o, func(p *orphan) { p.listed = true })
			c.attach.Enqueue(name)
		}
		if !decide.ForgetUnlisted(o.facts(), listed) {
			continue
		}
		c.dropOrphan(ctx, name, o)
		klog.FromContext(ctx).Info("Orphaned publication no longer listed by the driver; forgotten",
			"volumeAttachment", klog.KRef("", name), "volumeHandle", o.handle, "nodeID", o.nodeID)
	}
}
