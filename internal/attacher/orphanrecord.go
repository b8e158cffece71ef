package attacher

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/attacher/decide"
	"github.com/latchcsi/latch/internal/kube"
)

// The durable record of orphans (the ConfigMap
// external-attacher-orphans-<driver>, orphanstore.go) as the Controller
// uses it: read before attaches start, written before an orphan's first
// unpublish, cleared once it is settled, and read again whenever it
// changes (orphanwatch.go). The record only protects against losing an
// orphan across a restart: when it cannot be read or written, orphans are
// tracked in memory and every attach goes on, and the failure is shown
// where an operator looks (recordFailed).

// finishedEntry is an entry of the record the Controller is done with: its
// orphan was settled (unpublished, taken over, forgotten) or it is not
// acted on (decide.OrphanIgnored). Reading the record again does not adopt
// it a second time.
type finishedEntry struct {
	rec orphanRecord
	// removeFailed: the entry is csi-attacher's and should be gone, but
	// its removal failed; it is retried when the record is read again.
	removeFailed bool
}

// persistOrphan writes the orphan of name to the durable record when it is
// not there yet. A failure is reported (error log, metric, and a Warning
// event on the VolumeAttachment when its message changes) and kept with
// the orphan (showOrphanWait says it); the orphan stays in memory, is
// unpublished all the same, and the next attempt writes it again.
func (c *Controller) persistOrphan(ctx context.Context, name string) {
	o, ok := c.orphans.get(name)
	if !ok || o.recorded || o.unpublished || c.exec.records == nil {
		return
	}
	if err := c.exec.recordOrphan(ctx, recordOf(name, o)); err != nil {
		why := c.recordFailed("put", err)
		klog.FromContext(ctx).Error(err, "Could not record the orphaned publication; it is kept in memory only and is lost if the attacher restarts before it is unpublished",
			"volumeAttachment", klog.KRef("", name), "volumeHandle", o.handle, "nodeID", o.nodeID)
		if why != o.recordErr {
			c.exec.recorder.Event(orphanRef(name, o.uid), v1.EventTypeWarning, EventOrphanRecordFailed,
				fmt.Sprintf("could not record that volume %q must be unpublished from node ID %q: %s; it is unpublished from memory, and lost if csi-attacher restarts first", o.handle, o.nodeID, why))
		}
		c.updateOrphan(name, o, func(p *orphan) { p.recordErr = why })
		return
	}
	c.exec.metrics.orphanRecordAvailable(true)
	c.updateOrphan(name, o, func(p *orphan) { p.recorded, p.recordErr = true, "" })
}

// dropOrphan forgets the orphan o of name, removing its durable record
// first (only while the record still holds o: a newer orphan of the same
// name, recorded meanwhile, keeps its record). When the record cannot be
// written the orphan is forgotten all the same: the driver has answered,
// and a VolumeAttachment of that name must not wait for a ConfigMap. The
// failure is reported; the entry stays, its removal is retried whenever
// the record is read again, and a restarted attacher settles it by the
// same rules as any entry (decide.SettleOrphan: an unpublish of a volume
// that is no longer published is a no-op, one that a VolumeAttachment
// claims is never made).
func (c *Controller) dropOrphan(ctx context.Context, name string, o orphan) {
	removeFailed := false
	if o.recorded && c.exec.records != nil {
		if err := c.exec.unrecordOrphan(ctx, recordOf(name, o)); err != nil {
			removeFailed = true
			why := c.recordFailed("delete", err)
			klog.FromContext(ctx).Error(err, "Could not remove a settled orphaned publication from the record; it is forgotten all the same",
				"volumeAttachment", klog.KRef("", name), "volumeHandle", o.handle, "nodeID", o.nodeID)
			c.exec.recorder.Event(orphanRef(name, o.uid), v1.EventTypeWarning, EventOrphanRecordFailed,
				fmt.Sprintf("the publication of volume %q on node ID %q is settled, but its entry could not be removed from the record: %s; a restarted csi-attacher settles the entry again", o.handle, o.nodeID, why))
		} else {
			c.exec.metrics.orphanRecordAvailable(true)
		}
	}
	var done *finishedEntry
	if o.recorded {
		done = &finishedEntry{rec: recordOf(name, o), removeFailed: removeFailed}
	}
	if c.orphans.drop(name, o, done) {
		c.exec.metrics.orphanDropped()
		c.publicationSettled(o)
	}
}

// loadOrphans reads the record before any VolumeAttachment is attached,
// retrying with backoff while the read fails, so that a new
// VolumeAttachment of a recorded orphan's name waits for that orphan and a
// PV it holds keeps our finalizer. A read the API server forbids (missing
// RBAC) does not hold attaches back: they go on with orphans tracked in
// memory only (reported by recordUnreadable), and the read is retried in
// the background. It then keeps the record read again whenever it changes
// (watchRecord). false only when ctx is done first.
func (c *Controller) loadOrphans(ctx context.Context) bool {
	if c.exec.records == nil {
		return true
	}
	delay := c.retryStart()
	for {
		err := c.loadOrphansOnce(ctx)
		switch {
		case err == nil:
			go c.watchRecord(ctx)
			return true
		case apierrors.IsForbidden(err):
			c.recordUnreadable(ctx, err)
			go c.retryLoad(ctx, delay)
			go c.watchRecord(ctx)
			return true
		}
		klog.FromContext(ctx).Error(err, "Could not read the orphaned publications an earlier attacher recorded; no VolumeAttachment is attached until it can be read; retrying")
		select {
		case <-ctx.Done():
			return false
		case <-c.clock.After(delay):
		}
		delay = c.retryNext(delay)
	}
}

// retryLoad reads the record again, with backoff, until it succeeds, while
// attaches go on without it (loadOrphans).
func (c *Controller) retryLoad(ctx context.Context, delay time.Duration) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.clock.After(delay):
		}
		err := c.loadOrphansOnce(ctx)
		if err == nil {
			klog.FromContext(ctx).Info("The orphaned-publication record can be read again; orphans are recorded from now on", "configMap", c.recordName())
			c.exec.recorder.Event(c.leaseRef(), v1.EventTypeNormal, EventOrphanRecordAvailable,
				fmt.Sprintf("the orphan record, ConfigMap %s, can be read again; orphaned publications are recorded from now on", c.recordName()))
			return
		}
		if apierrors.IsForbidden(err) {
			c.recordUnreadable(ctx, err)
		} else {
			klog.FromContext(ctx).Error(err, "Could not read the orphaned-publication record; attaches go on, orphans are tracked in memory only; retrying", "configMap", c.recordName())
		}
		delay = c.retryNext(delay)
	}
}

func (c *Controller) retryStart() time.Duration {
	if c.cfg.RetryIntervalStart > 0 {
		return c.cfg.RetryIntervalStart
	}
	return time.Second
}

func (c *Controller) retryNext(delay time.Duration) time.Duration {
	return min(2*delay, max(c.cfg.RetryIntervalMax, delay))
}

// loadOrphansOnce reads the durable record and adopts every orphan it
// holds. Entries that are not valid records are reported and left out;
// the valid ones load.
func (c *Controller) loadOrphansOnce(ctx context.Context) error {
	recs, err := c.exec.records.Load(ctx)
	var invalid *invalidRecordsError
	if errors.As(err, &invalid) {
		c.invalidEntries(ctx, invalid)
		err = nil
	}
	if err != nil {
		c.recordFailed("load", err)
		return err
	}
	c.exec.metrics.orphanRecordAvailable(true)
	c.adoptRecords(ctx, recs)
	return nil
}

// invalidEntries reports entries that are not valid records: nothing tells
// what they would unpublish, so someone must look at them.
func (c *Controller) invalidEntries(ctx context.Context, invalid *invalidRecordsError) {
	c.exec.metrics.orphanRecordError("load")
	klog.FromContext(ctx).Error(invalid, "Ignoring entries of the orphaned-publication record that are not valid records; repair or remove them by hand", "entries", invalid.keys)
	c.exec.recorder.Event(c.recordRef(), v1.EventTypeWarning, EventOrphanRecordIgnored,
		fmt.Sprintf("entries %q are not valid records (a JSON object with volumeHandle and nodeID): csi-attacher unpublishes nothing for them; repair or remove them", invalid.keys))
}

// adoptRecords takes over the entries of the record (all of it, as read
// or as the watch delivered it) that are neither pending nor finished
// already. An entry that can never be acted on
// (decide.RecordedOrphanUnusable) is reported once and left out. A
// finished entry whose removal failed is removed now; finished entries
// the record no longer holds are forgotten.
func (c *Controller) adoptRecords(ctx context.Context, recs map[string]orphanRecord) {
	var retry []orphanRecord
	adopted := 0
	for _, name := range slices.Sorted(maps.Keys(recs)) {
		rec := recs[name]
		o := fromRecord(rec)
		why := decide.RecordedOrphanUnusable(o.facts())
		f, done, known := c.orphans.adopt(name, rec, o, why == "")
		switch {
		case done && f.removeFailed:
			retry = append(retry, f.rec)
		case done, known:
		case why != "":
			c.warnRecordEntry(ctx, name, o, why)
		default:
			adopted++
			c.exec.metrics.orphanAdded()
			klog.FromContext(ctx).Info("Orphaned publication recorded by an earlier attacher; settling it",
				"volumeAttachment", klog.KRef("", name), "volumeHandle", rec.VolumeHandle, "nodeID", rec.NodeID, "uid", rec.UID)
			c.attach.Enqueue(name)
		}
	}
	c.orphans.forgetFinished(recs)
	if adopted > 0 && c.canList() {
		go c.listRecorded(ctx)
	}
	for _, rec := range retry {
		if err := c.exec.unrecordOrphan(ctx, rec); err != nil {
			c.recordFailed("delete", err)
			klog.FromContext(ctx).V(2).Info("Removing a settled entry of the orphaned-publication record failed again", "entry", rec.VolumeAttachment, "err", err)
			continue
		}
		c.orphans.removed(rec)
	}
}

// listRecorded asks the driver at once which publications it has, for the
// entries just adopted from the record: such an entry is unpublished only
// once a listing shows it (decide.SettleOrphan), and a VolumeAttachment of
// its name, or a publish of its volume to another node, waits for that;
// the next ListVolumes reconcile may be a whole --reconcile-sync away. The
// listing settles every orphan pending before it began, as the
// reconcile's does (dropUnlisted). A failed listing is logged; the next
// reconcile decides then.
func (c *Controller) listRecorded(ctx context.Context) {
	before := c.orphanSnapshot()
	published, err := c.exec.listVolumes(ctx, c.cfg.ReconcileTimeout, c.cfg.MaxEntries)
	if err != nil {
		if ctx.Err() == nil {
			klog.FromContext(ctx).Error(err, "ListVolumes for the entries read from the orphaned-publication record failed; the next ListVolumes reconcile settles them")
		}
		return
	}
	c.dropUnlisted(ctx, before, published)
}

// ignoreOrphan drops the orphan o of name from memory without an
// unpublish and without touching the record, and reports why
// (decide.OrphanIgnored): the entry stays for a person to look at.
func (c *Controller) ignoreOrphan(ctx context.Context, name string, o orphan, why string) {
	if c.orphans.drop(name, o, &finishedEntry{rec: recordOf(name, o)}) {
		c.exec.metrics.orphanDropped()
		c.publicationSettled(o)
	}
	c.warnRecordEntry(ctx, name, o, why)
}

// warnRecordEntry reports an entry of the record that is not acted on: an
// error log and a Warning event on the record's ConfigMap.
func (c *Controller) warnRecordEntry(ctx context.Context, name string, o orphan, why string) {
	klog.FromContext(ctx).Error(nil, "Ignoring an entry of the orphaned-publication record: it is not acted on",
		"configMap", c.recordName(), "entry", name, "volumeHandle", o.handle, "nodeID", o.nodeID, "nodeName", o.nodeName, "uid", o.uid, "why", why)
	c.exec.recorder.Event(c.recordRef(), v1.EventTypeWarning, EventOrphanRecordIgnored,
		fmt.Sprintf("entry %q (volume %q, node ID %q) is not acted on: %s; csi-attacher unpublishes nothing for it (remove it if it is not csi-attacher's)", name, o.handle, o.nodeID, why))
}

// recordFailed counts a failed read (load), write (put, delete) or watch
// of the record and sets the unavailable gauge; it returns the sentence
// that says so on the objects a user looks at: which ConfigMap, the API
// server's answer and, when it refused for lack of RBAC, the exact rule to
// add (kube.OrphanRecordRule).
func (c *Controller) recordFailed(op string, err error) string {
	c.exec.metrics.orphanRecordError(op)
	c.exec.metrics.orphanRecordAvailable(false)
	what := map[string]string{"load": "read", "put": "written", "delete": "written", "watch": "watched"}[op]
	msg := fmt.Sprintf("the orphan record, ConfigMap %s, cannot be %s: ", c.recordName(), what)
	switch {
	case apierrors.IsForbidden(err):
		// The API server's answer (the user, the verb, the namespace)
		// is long and says less than the rule.
		return msg + "RBAC forbids it; add " + kube.OrphanRecordRule(c.cfg.OrphanNamespace, c.cfg.Driver.Name)
	case apierrors.IsInvalid(err):
		return msg + "the API server refuses the ConfigMap as it is (" + invalidCauses(err) +
			"): re-create it without immutable and binaryData, keeping its data"
	}
	return msg + err.Error()
}

// invalidCauses is what an Invalid answer says is wrong, field by field
// ("data[va-1]: duplicate of key present in binaryData"), without the
// object's name it repeats; its whole text when it carries no causes.
func invalidCauses(err error) string {
	var status apierrors.APIStatus
	if !errors.As(err, &status) || status.Status().Details == nil || len(status.Status().Details.Causes) == 0 {
		return err.Error()
	}
	var causes []string
	for _, c := range status.Status().Details.Causes {
		causes = append(causes, c.Field+": "+c.Message)
	}
	return strings.Join(causes, "; ")
}

// recordUnreadable reports that the record cannot be read for lack of
// RBAC, so attaches go on with orphans tracked in memory only: an error
// log and a Warning event on the Lease (where latchctl looks for the
// attacher itself), repeated on each retry (the event recorder counts
// them).
func (c *Controller) recordUnreadable(ctx context.Context, err error) {
	why := c.recordFailed("load", err)
	klog.FromContext(ctx).Error(err, "Cannot read the orphaned-publication record; attaching anyway, with orphaned publications tracked in memory only (a restart loses them)",
		"configMap", c.recordName(), "rule", kube.OrphanRecordRule(c.cfg.OrphanNamespace, c.cfg.Driver.Name))
	c.exec.recorder.Event(c.leaseRef(), v1.EventTypeWarning, EventOrphanRecordFailed,
		why+"; csi-attacher attaches anyway and tracks orphaned publications in memory only, so a restart loses those not yet unpublished, and the record of an earlier attacher is not read")
}

// recordName is "namespace/name" of the record's ConfigMap.
func (c *Controller) recordName() string {
	return c.cfg.OrphanNamespace + "/" + OrphanRecordName(c.cfg.Driver.Name)
}

// recordRef is what events about the record point at.
func (c *Controller) recordRef() *v1.ConfigMap {
	return &v1.ConfigMap{TypeMeta: metav1.TypeMeta{Kind: "ConfigMap", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Namespace: c.cfg.OrphanNamespace, Name: OrphanRecordName(c.cfg.Driver.Name)}}
}

// leaseRef is the attacher's Lease, which lives next to the record.
func (c *Controller) leaseRef() *coordinationv1.Lease {
	return &coordinationv1.Lease{TypeMeta: metav1.TypeMeta{Kind: "Lease", APIVersion: "coordination.k8s.io/v1"},
		ObjectMeta: metav1.ObjectMeta{Namespace: c.cfg.OrphanNamespace, Name: kube.LeaseName(c.cfg.Driver.Name)}}
}
