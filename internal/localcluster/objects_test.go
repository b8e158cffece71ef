package localcluster

import (
	"context"
	"testing"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
)

// Where kube-controller-manager's PV controller runs, it writes the
// pre-bound claim while CreateBoundVolume marks it bound: a conflict is
// retried on a fresh read (the demo failed once on it), for the claim as
// for the PV.
func TestCreateBoundVolume_retriesTheClaimsStatusOnConflict(t *testing.T) {
	client := fake.NewClientset()
	statusWrites := 0
	client.PrependReactor("update", "persistentvolumeclaims", func(a clienttesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "status" {
			return false, nil, nil
		}
		statusWrites++
		if statusWrites == 1 {
			return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "persistentvolumeclaims"}, "demo-volume", nil)
		}
		return false, nil, nil
	})
	_, pvc, err := CreateBoundVolume(context.Background(), client, VolumeSpec{Namespace: "default", Name: "demo-volume", Driver: "mock.csi.latch.dev"})
	if err != nil {
		t.Fatalf("CreateBoundVolume: %v", err)
	}
	if statusWrites != 2 || pvc.Status.Phase != v1.ClaimBound {
		t.Errorf("claim status writes %d, phase %q; want the conflict retried once and the claim Bound", statusWrites, pvc.Status.Phase)
	}
}

// kube-controller-manager's service-account controller may create the
// namespace's default ServiceAccount first: CreateNamespace takes it.
func TestCreateNamespace_defaultServiceAccountAlreadyMade(t *testing.T) {
	client := fake.NewClientset()
	client.PrependReactor("create", "serviceaccounts", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewAlreadyExists(schema.GroupResource{Resource: "serviceaccounts"}, "default")
	})
	if err := CreateNamespace(context.Background(), client, "team-a"); err != nil {
		t.Fatalf("CreateNamespace: %v", err)
	}
}
