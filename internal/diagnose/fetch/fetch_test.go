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
