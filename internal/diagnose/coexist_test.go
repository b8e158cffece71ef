package diagnose

import (
	"strings"
	"testing"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/kube"
)

const (
	specFields = `{"f:spec":{"f:attacher":{},"f:nodeName":{},"f:source":{"f:persistentVolumeName":{}}}}`
	metaFields = `{"f:metadata":{"f:finalizers":{".":{},"v:\"external-attacher/csi-example-com\"":{}}}}`
)

// createdBy is a VolumeAttachment created age ago by manager (which owns
// its spec), with csi-attacher's finalizer and status written later.
func createdBy(name, manager string, age time.Duration) *storagev1.VolumeAttachment {
	va := newVA(nodeA, true)
	va.Name = name
	va.CreationTimestamp = ago(age)
	t := ago(age)
	later := ago(age - time.Second)
	va.ManagedFields = []metav1.ManagedFieldsEntry{
		{Manager: manager, Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "storage.k8s.io/v1", Time: &t,
			FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(specFields)},
		{Manager: kube.AttacherFieldManager, Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "storage.k8s.io/v1", Time: &later,
			FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(metaFields)},
	}
	return va
}

// Issue 24: `latchctl status` says when kube-controller-manager's
// attach/detach controller and latch's both create VolumeAttachments.
func TestStatusFindingsTwoAttachDetachControllers(t *testing.T) {
	const kcm, latch = "kube-controller-manager", kube.AttachDetachFieldManager
	for _, tc := range []struct {
		name string
		vas  []*storagev1.VolumeAttachment
		want *expect // nil: no controllers finding
	}{
		{
			name: "both create VolumeAttachments in turn → problem naming both managers, one kcm object and the commands",
			vas: []*storagev1.VolumeAttachment{
				createdBy("csi-l1", latch, 30*time.Minute), createdBy("csi-k1", kcm, 20*time.Minute),
				createdBy("csi-l2", latch, 10*time.Minute), createdBy("csi-k2", kcm, 5*time.Minute),
			},
			want: &expect{"controllers.coexist", StatusProblem, []string{"VolumeAttachment csi-k2", `"kube-controller-manager"`, `"` + latch + `"`,
				"--controllers=*,-attachdetach", "kubectl get volumeattachment csi-k2 --show-managed-fields"}},
		},
		{
			name: "kcm's VolumeAttachments all older than latch's → a past swap: info, not a problem",
			vas: []*storagev1.VolumeAttachment{
				createdBy("csi-k1", kcm, 50*time.Minute), createdBy("csi-k2", kcm, 40*time.Minute),
				createdBy("csi-l1", latch, 30*time.Minute), createdBy("csi-l2", latch, 10*time.Minute),
			},
			want: &expect{"controllers.coexist", StatusInfo, []string{"older", "csi-k2"}},
		},
		{
			name: "latch's all older than kcm's → a rollback: info",
			vas:  []*storagev1.VolumeAttachment{createdBy("csi-l1", latch, 50*time.Minute), createdBy("csi-k1", kcm, 10*time.Minute)},
			want: &expect{"controllers.coexist", StatusInfo, []string{"older"}},
		},
		{
			name: "only latch's controller → no finding",
			vas:  []*storagev1.VolumeAttachment{createdBy("csi-l1", latch, 50*time.Minute), createdBy("csi-l2", latch, 10*time.Minute)},
		},
		{
			name: "only kcm's controller → no finding",
			vas:  []*storagev1.VolumeAttachment{createdBy("csi-k1", kcm, 50*time.Minute)},
		},
		{
			name: "a kubelet that attaches its own volumes (unmanaged node) beside latch → no finding",
			vas: []*storagev1.VolumeAttachment{
				createdBy("csi-l1", latch, 30*time.Minute), createdBy("csi-u1", "kubelet", 20*time.Minute), createdBy("csi-l2", latch, 10*time.Minute),
			},
		},
		{
			name: "kcm wrote only metadata of latch's VolumeAttachments (not their spec) → no finding",
			vas: func() []*storagev1.VolumeAttachment {
				va := createdBy("csi-l2", latch, 10*time.Minute)
				va.ManagedFields[1].Manager = kcm
				return []*storagev1.VolumeAttachment{createdBy("csi-l1", latch, 30*time.Minute), va}
			}(),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			findings := StatusFindings(tc.vas)
			var got []Finding
			for _, f := range findings {
				if f.Check == "controllers.coexist" {
					got = append(got, f)
				}
			}
			if tc.want == nil {
				if len(got) > 0 {
					t.Fatalf("want no finding, got %+v", got)
				}
				return
			}
			checkExpect(t, Report{Findings: findings}, *tc.want)
			for _, f := range got {
				if f.Object == "" || (f.Status == StatusProblem && f.Hint == "") {
					t.Errorf("finding without object or next step: %+v", f)
				}
				if f.Status == StatusProblem && !strings.Contains(f.Hint, "kubectl") {
					t.Errorf("problem finding without a command: %+v", f)
				}
			}
		})
	}
}
