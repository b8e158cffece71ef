package diagnose

import (
	"fmt"
	"regexp"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/latchcsi/latch/internal/kube"
)

// RefLease is the involvedObject kind of a RefEventList about a Lease.
const RefLease RefKind = "Lease"

// Events csi-attacher records on its Lease about its orphan record, the
// ConfigMap external-attacher-orphans-<driver> (internal/attacher:
// EventOrphanRecordFailed and EventOrphanRecordAvailable).
const (
	eventOrphanRecordFailed    = "OrphanRecordFailed"
	eventOrphanRecordAvailable = "OrphanRecordAvailable"
)

// explainOrphanRecord reports a csi-attacher that cannot read, write or
// watch its orphan record, as its Lease's events say: the latest Warning
// OrphanRecordFailed that is newer than the latest OrphanRecordAvailable
// and than the Lease's acquisition (an earlier holder's event says nothing
// of this one). Attaches go on then, but an orphaned publication (a
// VolumeAttachment deleted while the driver published it) is tracked in
// memory only and a restart of csi-attacher loses it: a problem, with the
// Role rule that fixes it.
func (w *walker) explainOrphanRecord(l *coordLease, driver string) {
	evs, ref := w.events(RefLease, l.Namespace, l.Name)
	if _, ok := w.unreadable(ref); ok {
		return
	}
	var failed, available *v1.Event
	for _, e := range evs {
		switch {
		case e.Reason == eventOrphanRecordFailed && e.Type == v1.EventTypeWarning:
			if failed == nil || eventTime(e).After(eventTime(failed)) {
				failed = e
			}
		case e.Reason == eventOrphanRecordAvailable:
			if available == nil || eventTime(e).After(eventTime(available)) {
				available = e
			}
		}
	}
	switch {
	case failed == nil:
		return
	case available != nil && !eventTime(available).Before(eventTime(failed)):
		return
	case l.Spec.AcquireTime != nil && eventTime(failed).Before(l.Spec.AcquireTime.Truncate(time.Second)):
		// An event's time has whole seconds, the Lease's finer ones.
		return
	}
	w.add(Finding{Check: "attacher.orphanRecord", Object: "ConfigMap " + key(l.Namespace, kube.OrphanRecordName(driver)), Status: StatusProblem,
		Message: fmt.Sprintf("csi-attacher of driver %s cannot use its orphan record (Warning %s on Lease %s, %s ago): %s",
			driver, eventOrphanRecordFailed, key(l.Namespace, l.Name), ageOrNever(w.s.Now, eventTime(failed)), strings.TrimSpace(failed.Message)),
		Hint: orphanRecordFix(l.Namespace, driver)})
}

// orphanRecordFix is the next step for a csi-attacher whose orphan record
// in namespace cannot be used.
func orphanRecordFix(namespace, driver string) string {
	return fmt.Sprintf("add %s (deploy/csi-attacher/rbac.yaml, Role latch-csi-attacher-orphans, has it); if the API server refuses the ConfigMap itself (immutable, or a key that is also a binaryData key), re-create it without them, keeping its data. Until then attaches go on, but orphaned publications are tracked in memory only and a restart of csi-attacher loses them",
		kube.OrphanRecordRule(namespace, driver))
}

// orphanRecordRE finds the record's ConfigMap in csi-attacher's messages.
var orphanRecordRE = regexp.MustCompile(`ConfigMap ([a-z0-9.-]+)/external-attacher-orphans-`)

// orphanHint is the next step for an attachError that csi-attacher's
// orphan bookkeeping wrote (internal/attacher): a publication left by a
// deleted VolumeAttachment that must be undone first, or a record that
// cannot be written. ok is false for other messages.
func orphanHint(msg, driver string) (hint string, ok bool) {
	if m := orphanRecordRE.FindStringSubmatch(msg); m != nil && strings.Contains(msg, "cannot be") {
		return orphanRecordFix(m[1], driver), true
	}
	if strings.Contains(msg, "may be published to one node only") || strings.Contains(msg, "waiting for the publication of volume") {
		return fmt.Sprintf("csi-attacher unpublishes a publication whose VolumeAttachment was deleted while driver %s published it before it publishes the volume again: see the OrphanedPublication events and why ControllerUnpublishVolume fails in the logs of the driver's controller Pod; it retries with backoff", driver), true
	}
	return "", false
}
