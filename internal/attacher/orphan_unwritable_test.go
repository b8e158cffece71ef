package attacher

import (
	"context"
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/testutil"

	"github.com/latchcsi/latch/internal/csimock"
)

// unwritableStore is a record whose Puts or Deletes fail with err.
type unwritableStore struct {
	*memOrphanStore
	putErr, deleteErr error
}

func (s *unwritableStore) Put(ctx context.Context, rec orphanRecord) error {
	if s.putErr != nil {
		return s.putErr
	}
	return s.memOrphanStore.Put(ctx, rec)
}

func (s *unwritableStore) Delete(ctx context.Context, rec orphanRecord) error {
	if s.deleteErr != nil {
		return s.deleteErr
	}
	return s.memOrphanStore.Delete(ctx, rec)
}

// The API server's answers to a write of a record it will not store.
var unwritableShapes = []struct {
	name string
	err  error
	// want is what the VolumeAttachment's message must say about it.
	want string
}{
	{"immutable ConfigMap", apierrors.NewInvalid(v1.SchemeGroupVersion.WithKind("ConfigMap").GroupKind(), "external-attacher-orphans-x",
		field.ErrorList{field.Forbidden(field.NewPath("data"), "field is immutable when `immutable` is set")}), "re-create it without immutable"},
	{"data key that is also a binaryData key", apierrors.NewInvalid(v1.SchemeGroupVersion.WithKind("ConfigMap").GroupKind(), "external-attacher-orphans-x",
		field.ErrorList{field.Invalid(field.NewPath("data").Key("va-a"), "va-a", "duplicate of key present in binaryData")}), "binaryData"},
	{"RBAC that forbids it", apierrors.NewForbidden(v1.Resource("configmaps"), "external-attacher-orphans-x", errors.New(`User "system:serviceaccount:latch-system:csi-attacher" cannot update resource "configmaps"`)),
		`resourceNames: ["external-attacher-orphans-executor-csi-latch-dev"], verbs: ["get", "list", "watch", "update"]`},
}

// A record that cannot be written does not hold an orphan, or the new
// VolumeAttachment of its name, forever. va-a is force-deleted during its
// publish; its first two unpublishes fail. A new va-a (another node) waits
// for the orphan. For each way the API server refuses the record:
//
//   - the write of the entry fails: the new VolumeAttachment's attachError
//     says the orphan is in memory only and why, a Warning
//     OrphanRecordFailed event names the cause, and once the driver
//     unpublished it the new VolumeAttachment is attached;
//   - the entry was written, but its removal fails: once the driver
//     unpublished it the orphan is forgotten all the same (a Warning
//     OrphanRecordFailed event says the entry stayed) and the new
//     VolumeAttachment is attached.
//
// Both count in latch_attacher_orphan_record_errors_total and set
// latch_attacher_orphan_record_unavailable.
func TestOrphanRecordThatCannotBeWrittenHoldsNothingForever(t *testing.T) {
	for _, shape := range unwritableShapes {
		for _, op := range []string{"put", "delete"} {
			t.Run(shape.name+"/"+op, func(t *testing.T) {
				f := newExecFixture(t, execPV("pv-a"), execVA("va-a", "pv-a"), execCSINode(), csiNodeOf("node-2", "node-2-id"))
				f.ctrl.cfg.OrphanNamespace = "latch-system"
				m := NewMetrics()
				m.Register(metrics.NewKubeRegistry().MustRegister)
				f.ctrl.exec.metrics = m
				store := &unwritableStore{memOrphanStore: &memOrphanStore{recs: map[string]orphanRecord{}}}
				if op == "put" {
					store.putErr = shape.err
				} else {
					store.deleteErr = shape.err
				}
				f.ctrl.exec.records = store
				forceDeleteOnFirstStatusPatch(f, "va-a")
				if _, err := f.driver.AddFault(csimock.Rule{Method: "ControllerUnpublishVolume", Times: 2, Code: codes.Unavailable, Message: "backend unreachable"}); err != nil {
					t.Fatal(err)
				}
				if _, err := f.ctrl.syncAttach(f.ctx, "va-a"); err == nil {
					t.Fatal("pass 1 succeeded, want the orphan's failed unpublish")
				}
				f.waitFor("old va-a gone from the cache", func() bool { _, exists, _ := f.vaStore.GetByKey("va-a"); return !exists })
				newVA := execVA("va-a", "pv-a")
				newVA.UID, newVA.Spec.NodeName = types.UID("uid-va-a-2"), "node-2"
				if err := f.tracker.Add(newVA); err != nil {
					t.Fatal(err)
				}
				f.waitFor("new va-a in the cache", func() bool { va, _ := LookupVA(f.vaStore, "va-a"); return va != nil && va.UID == "uid-va-a-2" })

				// Pass 2: the unpublish fails again; the new VA waits.
				if _, err := f.ctrl.syncAttach(f.ctx, "va-a"); err == nil {
					t.Fatal("pass 2 succeeded, want the orphan's failed unpublish")
				}
				ae := f.va("va-a").Status.AttachError
				if ae == nil || !strings.Contains(ae.Message, "waiting for the publication of volume") {
					t.Fatalf("new va-a attachError = %+v, want it to say it waits for the orphan", ae)
				}
				if op == "put" {
					for _, want := range []string{"tracked in memory only", "latch-system/external-attacher-orphans-", shape.want} {
						if !strings.Contains(ae.Message, want) {
							t.Errorf("new va-a attachError %q does not say %q", ae.Message, want)
						}
					}
				}
				if got, _ := testutil.GetGaugeMetricValue(m.orphanRecordUnavailable); op == "put" && got != 1 {
					t.Errorf("latch_attacher_orphan_record_unavailable = %v after a refused write, want 1", got)
				}

				// Pass 3: the driver unpublishes; the new VA is attached.
				if _, err := f.ctrl.syncAttach(f.ctx, "va-a"); err != nil {
					t.Fatalf("pass 3: %v", err)
				}
				f.requireCSICalls(
					"ControllerPublishVolume handle-pv-a node-1-id OK",
					"ControllerUnpublishVolume handle-pv-a node-1-id Unavailable",
					"ControllerUnpublishVolume handle-pv-a node-1-id Unavailable",
					"ControllerUnpublishVolume handle-pv-a node-1-id OK",
					"ControllerPublishVolume handle-pv-a node-2-id OK")
				if va := f.va("va-a"); !va.Status.Attached || va.Status.AttachError != nil {
					t.Errorf("new va-a status = %+v, want attached", va.Status)
				}
				if left := f.ctrl.orphanSnapshot(); len(left) != 0 {
					t.Errorf("orphans left = %v, want none", left)
				}
				recordFailed := 0
				for _, e := range drainEvents(f.recorder) {
					if strings.HasPrefix(e, "Warning "+EventOrphanRecordFailed) && strings.Contains(e, shape.want) {
						recordFailed++
					}
				}
				if recordFailed != 1 {
					t.Errorf("%d Warning %s events naming the cause, want 1", recordFailed, EventOrphanRecordFailed)
				}
				if got, _ := testutil.GetCounterMetricValue(m.orphanRecordErrors.WithLabelValues(op)); got < 1 {
					t.Errorf("latch_attacher_orphan_record_errors_total{operation=%q} = %v, want the failure counted", op, got)
				}
			})
		}
	}
}
