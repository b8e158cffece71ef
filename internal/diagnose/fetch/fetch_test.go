package fetch

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/latchcsi/latch/internal/diagnose"
)

var target = diagnose.Target{Kind: diagnose.TargetPod, Namespace: "app", Name: "web"}

func podWithClaim() *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "web"},
		Spec: v1.PodSpec{Volumes: []v1.Volume{{Name: "d", VolumeSource: v1.VolumeSource{
			PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: "data"}}}}},
	}
}

func TestSnapshotRecordsNotFoundAndStops(t *testing.T) {
	client := fake.NewClientset(podWithClaim())
	s, err := Snapshot(context.Background(), client, target, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if p, ok := s.PVCs["app/data"]; !ok || p != nil {
		t.Fatalf("PVC app/data: present=%v, want recorded as not found", ok)
	}
	for _, f := range diagnose.Explain(target, s).Findings {
		if f.Check == "pvc.exists" && f.Status == diagnose.StatusProblem && strings.Contains(f.Message, "app/data") {
			return
		}
	}
	t.Errorf("report does not name the missing PVC app/data as a problem")
}

func TestSnapshotTreatsForbiddenAsUnreadable(t *testing.T) {
	client := fake.NewClientset(podWithClaim())
	client.PrependReactor("get", "persistentvolumeclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "persistentvolumeclaims"}, "data", errors.New("rbac"))
	})
	s, err := Snapshot(context.Background(), client, target, time.Now())
	if err != nil {
		t.Fatalf("a forbidden read must not abort: %v", err)
	}
	ref := diagnose.Ref{Kind: diagnose.RefPVC, Namespace: "app", Name: "data"}
	if _, ok := s.Unreadable[ref]; !ok {
		t.Fatalf("Unreadable = %v, want %s", s.Unreadable, ref)
	}
	if r := diagnose.Explain(target, s); !r.Healthy() {
		t.Errorf("a refused read must be info, not a problem: %+v", r.Findings)
	}
}

func TestSnapshotReturnsOtherErrorsNamingTheObject(t *testing.T) {
	client := fake.NewClientset()
	client.PrependReactor("get", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewServiceUnavailable("etcd down")
	})
	_, err := Snapshot(context.Background(), client, target, time.Now())
	if !apierrors.IsServiceUnavailable(err) || !strings.Contains(err.Error(), "Pod app/web") {
		t.Fatalf("err = %v, want a wrapped ServiceUnavailable naming Pod app/web", err)
	}
}

// With an attach pending and no Lease, the fetcher lists the Pods of every
// namespace and keeps those with a csi-attacher container: the report then
// says leader election is off (the attacher runs without it) instead of
// only "no Lease".
func TestSnapshotReadsAttacherPodsWhenNoLeaseExplainsAPendingAttach(t *testing.T) {
	pv := "pv-data"
	client := fake.NewClientset(
		podWithClaim(),
		&v1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "data", UID: "uid-data"},
			Spec: v1.PersistentVolumeClaimSpec{VolumeName: pv}, Status: v1.PersistentVolumeClaimStatus{Phase: v1.ClaimBound}},
		&v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: pv}, Spec: v1.PersistentVolumeSpec{
			ClaimRef:               &v1.ObjectReference{Namespace: "app", Name: "data", UID: "uid-data"},
			PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: "d.example.com", VolumeHandle: "h"}}}},
		&v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "storage", Name: "ctrl-0"},
			Spec:   v1.PodSpec{Containers: []v1.Container{{Name: "csi-attacher", Image: "registry.k8s.io/sig-storage/csi-attacher:v4.13.0"}}},
			Status: v1.PodStatus{Phase: v1.PodRunning}},
		&v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "other", Name: "unrelated"},
			Spec: v1.PodSpec{Containers: []v1.Container{{Name: "app", Image: "nginx"}}}},
	)
	web := podWithClaim()
	web.Spec.NodeName = "n1"
	if _, err := client.CoreV1().Pods("app").Update(context.Background(), web, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	s, err := Snapshot(context.Background(), client, target, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if !s.AttacherPodsListed {
		t.Fatal("attacher Pods were not listed")
	}
	if _, ok := s.Pods["other/unrelated"]; ok {
		t.Error("a Pod without a csi-attacher container was kept")
	}
	for _, f := range diagnose.Explain(target, s).Findings {
		if f.Check == "attacher.lease" && strings.Contains(f.Message, "leader election is off") && strings.Contains(f.Hint, "kubectl -n storage logs ctrl-0 -c csi-attacher") {
			return
		}
	}
	t.Errorf("no attacher.lease finding saying leader election is off: %+v", diagnose.Explain(target, s).Findings)
}
