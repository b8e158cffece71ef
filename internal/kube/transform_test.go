package kube

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

func fullPV(driver string) *v1.PersistentVolume {
	now := metav1.Now()
	pv := &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{
			Name: "pv-1", UID: "u1", ResourceVersion: "42", DeletionTimestamp: &now,
			Finalizers:    []string{"kubernetes.io/pv-protection"},
			Labels:        map[string]string{"big": "label"},
			Annotations:   map[string]string{"pv.kubernetes.io/provisioned-by": driver},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kcm"}},
		},
		Spec: v1.PersistentVolumeSpec{
			Capacity:     v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:  []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			ClaimRef:     &v1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: "ns", Name: "claim", UID: "cu", ResourceVersion: "7"},
			MountOptions: []string{"noatime"},
		},
		Status: v1.PersistentVolumeStatus{Phase: v1.VolumeBound, Message: "long message"},
	}
	if driver != "" {
		pv.Spec.CSI = &v1.CSIPersistentVolumeSource{
			Driver: driver, VolumeHandle: "h1", FSType: "ext4",
			VolumeAttributes:           map[string]string{"a": "b"},
			ControllerPublishSecretRef: &v1.SecretReference{Name: "s", Namespace: "ns"},
		}
	} else {
		pv.Spec.HostPath = &v1.HostPathVolumeSource{Path: "/tmp"}
	}
	return pv
}

func TestStripManagedFields(t *testing.T) {
	pv := fullPV("x")
	got, err := StripManagedFields(pv)
	if err != nil {
		t.Fatal(err)
	}
	out := got.(*v1.PersistentVolume)
	if out.ManagedFields != nil {
		t.Fatalf("managedFields kept: %v", out.ManagedFields)
	}
	if out.Labels["big"] != "label" {
		t.Fatal("StripManagedFields removed more than managedFields")
	}
	tomb := cache.DeletedFinalStateUnknown{Key: "k", Obj: fullPV("x")}
	if got, _ := StripManagedFields(tomb); got.(cache.DeletedFinalStateUnknown).Obj.(*v1.PersistentVolume).ManagedFields == nil {
		t.Fatal("tombstone content modified")
	}
	if got, _ := StripManagedFields("not an object"); got != "not an object" {
		t.Fatal("non-object changed")
	}
}
