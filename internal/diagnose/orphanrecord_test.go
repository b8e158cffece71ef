package diagnose

import (
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// leaseEvent is an event csi-attacher records on its Lease in kube-system.
func leaseEvent(typ, reason string, at time.Duration) *v1.Event {
	e := newEvent("Lease", "kube-system", kube.LeaseName(drv), reason,
		`the orphan record, ConfigMap kube-system/external-attacher-orphans-csi-example-com, cannot be read: configmaps "external-attacher-orphans-csi-example-com" is forbidden`)
	e.Name += at.String()
	e.Type, e.LastTimestamp = typ, ago(at)
	return e
}

// A csi-attacher that runs with a driver's Lease-only Role cannot read its
// orphan record: it attaches anyway (the VolumeAttachment is attached) and
// says so on its Lease. latchctl reports a problem with the exact Role rule
// to add, until the attacher reports the record available again; a Warning
// older than the Lease's current holder is an earlier instance's.
func TestExplainOrphanRecordUnavailable(t *testing.T) {
	rule := `in a Role in namespace "kube-system" bound to csi-attacher's ServiceAccount: {apiGroups: [""], resources: ["configmaps"], resourceNames: ["external-attacher-orphans-csi-example-com"], verbs: ["get", "list", "watch", "update"]} and {apiGroups: [""], resources: ["configmaps"], verbs: ["create"]}`
	withLeaseEvents := func(evs ...runtime.Object) []runtime.Object { return append(healthy(), evs...) }
	runScenarios(t, []scenario{
		{
			name: "record forbidden → problem naming the ConfigMap, with the Role rule",
			objs: withLeaseEvents(leaseEvent(v1.EventTypeWarning, eventOrphanRecordFailed, time.Minute)),
			want: []expect{
				{"attacher.lease", StatusOK, nil},
				{"attacher.orphanRecord", StatusProblem, []string{"kube-system/external-attacher-orphans-csi-example-com", "forbidden", "in memory only", rule}},
			},
		},
		{
			name:    "record available again since → no finding",
			objs:    withLeaseEvents(leaseEvent(v1.EventTypeWarning, eventOrphanRecordFailed, 2*time.Minute), leaseEvent(v1.EventTypeNormal, eventOrphanRecordAvailable, time.Minute)),
			healthy: true,
			absent:  []string{"attacher.orphanRecord"},
		},
		{
			name: "failed again after it was available → problem",
			objs: withLeaseEvents(leaseEvent(v1.EventTypeNormal, eventOrphanRecordAvailable, 2*time.Minute), leaseEvent(v1.EventTypeWarning, eventOrphanRecordFailed, time.Minute)),
			want: []expect{{"attacher.orphanRecord", StatusProblem, []string{rule}}},
		},
		{
			name: "warning of an earlier holder of the Lease → no finding",
			objs: edit(withLeaseEvents(leaseEvent(v1.EventTypeWarning, eventOrphanRecordFailed, 10*time.Minute)), "", func(l *coordinationv1.Lease) {
				l.Spec.AcquireTime = &metav1.MicroTime{Time: now.Add(-time.Minute)}
			}),
			healthy: true,
			absent:  []string{"attacher.orphanRecord"},
		},
		{
			name: "VolumeAttachment waits for an orphan that cannot be recorded → its attachError's hint is the Role rule",
			objs: edit(healthy(), "", func(va *storagev1.VolumeAttachment) {
				va.Status.Attached = false
				va.Status.AttachError = &storagev1.VolumeError{Time: ago(time.Minute), Message: `waiting for the publication of volume "vol-1234" on node ID "n", left by a deleted VolumeAttachment of the same name (uid u), to be unpublished; it is tracked in memory only, and lost if csi-attacher restarts before the unpublish succeeds: the orphan record, ConfigMap kube-system/external-attacher-orphans-csi-example-com, cannot be written: RBAC forbids it; add ` + rule + `; last unpublish error: rpc error: code = Unavailable`}
			}),
			target: Target{Kind: TargetVA, Name: kubenames.VolumeAttachmentName(handle, drv, nodeA)},
			want:   []expect{{"va.attachError", StatusProblem, []string{"tracked in memory only", rule}}},
		},
	})
}
