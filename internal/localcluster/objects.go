package localcluster

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

// A local cluster runs no kube-controller-manager, so nothing binds PVCs to
// PVs. These helpers create objects already in the state the PV controller
// would leave them in.

// VolumeSpec describes a pre-bound CSI PV and its PVC.
type VolumeSpec struct {
	Namespace   string // of the PVC
	Name        string // used for both the PV and the PVC
	Driver      string
	Handle      string // volume handle; defaults to Name
	AccessModes []v1.PersistentVolumeAccessMode
	ReadOnly    bool
	FSType      string
	// SecretRef is set as spec.csi.controllerPublishSecretRef when not nil.
	SecretRef *v1.SecretReference
	// ClaimRef, when not nil, is the PV's claimRef instead of the PVC's
	// own reference: a PVC that names a PV bound to another claim, from
	// its creation on.
	ClaimRef *v1.ObjectReference
}

// CreateBoundVolume creates a CSI PV and a PVC bound to each other, both with
// phase Bound.
func CreateBoundVolume(ctx context.Context, client kubernetes.Interface, spec VolumeSpec) (*v1.PersistentVolume, *v1.PersistentVolumeClaim, error) {
	if spec.Handle == "" {
		spec.Handle = spec.Name
	}
	if len(spec.AccessModes) == 0 {
		spec.AccessModes = []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}
	}
	size := resource.MustParse("1Gi")
	pvc := &v1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: spec.Namespace, Name: spec.Name},
		Spec: v1.PersistentVolumeClaimSpec{
			AccessModes:      spec.AccessModes,
			Resources:        v1.VolumeResourceRequirements{Requests: v1.ResourceList{v1.ResourceStorage: size}},
			VolumeName:       spec.Name,
			StorageClassName: new(string),
		},
	}
	pvc, err := client.CoreV1().PersistentVolumeClaims(spec.Namespace).Create(ctx, pvc, metav1.CreateOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("create PVC %s/%s: %w", spec.Namespace, spec.Name, err)
	}
	pv := &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: spec.Name},
		Spec: v1.PersistentVolumeSpec{
			AccessModes: spec.AccessModes,
			Capacity:    v1.ResourceList{v1.ResourceStorage: size},
			ClaimRef: &v1.ObjectReference{
				Kind: "PersistentVolumeClaim", APIVersion: "v1",
				Namespace: pvc.Namespace, Name: pvc.Name, UID: pvc.UID,
			},
			PersistentVolumeReclaimPolicy: v1.PersistentVolumeReclaimRetain,
			PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{
				Driver:                     spec.Driver,
				VolumeHandle:               spec.Handle,
				ReadOnly:                   spec.ReadOnly,
				FSType:                     spec.FSType,
				ControllerPublishSecretRef: spec.SecretRef,
			}},
		},
	}
	if spec.ClaimRef != nil {
		pv.Spec.ClaimRef = spec.ClaimRef
	}
	pv, err = client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("create PV %s: %w", spec.Name, err)
	}
	// A controller may already be writing the PV (the attacher adds its
	// finalizer as soon as a VolumeAttachment names it): retry on conflict.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pv.Status.Phase = v1.VolumeBound
		updated, err := client.CoreV1().PersistentVolumes().UpdateStatus(ctx, pv, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			if fresh, gerr := client.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{}); gerr == nil {
				pv = fresh
			}
			return err
		}
		if err == nil {
			pv = updated
		}
		return err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("mark PV %s bound: %w", spec.Name, err)
	}
	// kube-controller-manager's PV controller, where it runs, binds the
	// pre-bound pair too and writes the claim meanwhile: retry on conflict.
	claims := client.CoreV1().PersistentVolumeClaims(spec.Namespace)
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pvc.Status.Phase = v1.ClaimBound
		pvc.Status.AccessModes = spec.AccessModes
		pvc.Status.Capacity = v1.ResourceList{v1.ResourceStorage: size}
		updated, err := claims.UpdateStatus(ctx, pvc, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			if fresh, gerr := claims.Get(ctx, pvc.Name, metav1.GetOptions{}); gerr == nil {
				pvc = fresh
			}
			return err
		}
		if err == nil {
			pvc = updated
		}
		return err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("mark PVC %s/%s bound: %w", spec.Namespace, spec.Name, err)
	}
	return pv, pvc, nil
}

// NewPod returns a Pod bound to node that mounts the given PVCs.
func NewPod(namespace, name, node string, claims ...string) *v1.Pod {
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: v1.PodSpec{
			NodeName:   node,
			Containers: []v1.Container{{Name: "app", Image: "registry.invalid/app:latest"}},
		},
	}
	for i, claim := range claims {
		vol := fmt.Sprintf("vol-%d", i)
		pod.Spec.Volumes = append(pod.Spec.Volumes, v1.Volume{
			Name:         vol,
			VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: claim}},
		})
		pod.Spec.Containers[0].VolumeMounts = append(pod.Spec.Containers[0].VolumeMounts, v1.VolumeMount{Name: vol, MountPath: "/data/" + vol})
	}
	return pod
}

// NewCSIDriver returns a CSIDriver object; attachRequired nil leaves the
// field to its API default (true).
func NewCSIDriver(name string, attachRequired *bool) *storagev1.CSIDriver {
	return &storagev1.CSIDriver{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       storagev1.CSIDriverSpec{AttachRequired: attachRequired},
	}
}

// CreateNamespace creates a namespace with a "default" ServiceAccount
// (without kube-controller-manager no controller creates one in a local
// cluster).
func CreateNamespace(ctx context.Context, client kubernetes.Interface, name string) error {
	ns := &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create namespace %s: %w", name, err)
	}
	// kube-controller-manager's service-account controller, where it
	// runs, may have made it already.
	sa := &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: name, Name: "default"}}
	if _, err := client.CoreV1().ServiceAccounts(name).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create default ServiceAccount in %s: %w", name, err)
	}
	return nil
}
