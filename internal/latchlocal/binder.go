package latchlocal

import (
	"context"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
)

// runBinder stands in for the PV controller, which a local cluster lacks,
// for the one case the examples need: a PVC that names its PV
// (spec.volumeName) and a PV whose claimRef names that PVC are marked
// Bound, so manifests applied with kubectl in `up` mode behave as in a
// real cluster. Dynamic provisioning and matching are out of scope.
func (e *Env) runBinder(ctx context.Context) {
	logger := klog.FromContext(ctx).WithName("binder")
	wait.UntilWithContext(ctx, func(ctx context.Context) {
		pvcs, err := e.Client.CoreV1().PersistentVolumeClaims("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return
		}
		for i := range pvcs.Items {
			pvc := &pvcs.Items[i]
			if pvc.Spec.VolumeName == "" || pvc.Status.Phase == v1.ClaimBound {
				continue
			}
			pv, err := e.Client.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
			if err != nil || pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.Namespace != pvc.Namespace || pv.Spec.ClaimRef.Name != pvc.Name {
				continue
			}
			if pv.Spec.ClaimRef.UID == "" {
				pv.Spec.ClaimRef.UID = pvc.UID
				if pv, err = e.Client.CoreV1().PersistentVolumes().Update(ctx, pv, metav1.UpdateOptions{}); err != nil {
					continue
				}
			}
			if pv.Spec.ClaimRef.UID != pvc.UID {
				continue
			}
			pv.Status.Phase = v1.VolumeBound
			if _, err := e.Client.CoreV1().PersistentVolumes().UpdateStatus(ctx, pv, metav1.UpdateOptions{}); err != nil {
				continue
			}
			pvc.Status.Phase = v1.ClaimBound
			pvc.Status.AccessModes = pv.Spec.AccessModes
			pvc.Status.Capacity = pv.Spec.Capacity
			if _, err := e.Client.CoreV1().PersistentVolumeClaims(pvc.Namespace).UpdateStatus(ctx, pvc, metav1.UpdateOptions{}); err == nil {
				logger.V(2).Info("Bound pre-bound claim", "pvc", klog.KObj(pvc), "pv", pv.Name)
			}
		}
	}, time.Second)
}
