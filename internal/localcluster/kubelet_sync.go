package localcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
)

// syncNode is one level-triggered pass over a node: report volumes in use,
// start Pods whose volumes are attached, release volumes of Pods that are
// gone and finish their deletion.
func (k *Kubelet) syncNode(ctx context.Context, name string) error {
	logger := klog.FromContext(ctx).WithValues("node", name)
	node, err := k.nodes.Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	objs, err := k.pods.GetIndexer().ByIndex(podNodeIndex, name)
	if err != nil {
		return err
	}
	attached := sets.New[v1.UniqueVolumeName]()
	for _, av := range node.Status.VolumesAttached {
		attached.Insert(av.Name)
	}

	inUse := sets.New[v1.UniqueVolumeName]()
	var toStart, toFinish []*v1.Pod
	for _, obj := range objs {
		pod := obj.(*v1.Pod)
		terminating := pod.DeletionTimestamp != nil || pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed
		if terminating {
			k.forgetStarted(pod.UID)
			if pod.DeletionTimestamp != nil {
				toFinish = append(toFinish, pod)
			}
			continue
		}
		vols, ready := k.podVolumes(pod)
		if !ready {
			continue
		}
		if k.isStarted(pod) || attached.HasAll(vols...) {
			inUse.Insert(vols...)
			toStart = append(toStart, pod)
		}
	}

	want := sets.List(inUse)
	if !slices.Equal(want, node.Status.VolumesInUse) {
		if want == nil {
			want = []v1.UniqueVolumeName{}
		}
		patch, _ := json.Marshal(map[string]any{"status": map[string]any{"volumesInUse": want}})
		if _, err := k.client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, patch,
			metav1.PatchOptions{FieldManager: kubeletFieldManager}, "status"); err != nil {
			return fmt.Errorf("report volumes in use on node %s: %w", name, err)
		}
		logger.V(4).Info("Kubelet stand-in reported volumes in use", "count", len(want))
	}

	for _, pod := range toStart {
		k.markStarted(pod.UID)
		if pod.Status.Phase == v1.PodRunning {
			continue
		}
		if err := k.startPod(ctx, pod); err != nil {
			return err
		}
		logger.V(4).Info("Kubelet stand-in started pod", "pod", klog.KObj(pod))
	}
	for _, pod := range toFinish {
		// The volumes are out of volumesInUse (patched above): the "unmount"
		// is done, so the Pod object can go.
		err := k.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: new(int64),
			Preconditions:      &metav1.Preconditions{UID: &pod.UID},
		})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("finish deletion of pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		logger.V(4).Info("Kubelet stand-in finished pod deletion", "pod", klog.KObj(pod))
	}
	return nil
}

func (k *Kubelet) startPod(ctx context.Context, pod *v1.Pod) error {
	pod = pod.DeepCopy()
	now := metav1.Now()
	pod.Status.Phase = v1.PodRunning
	pod.Status.StartTime = &now
	pod.Status.Conditions = []v1.PodCondition{
		{Type: v1.PodReady, Status: v1.ConditionTrue, LastTransitionTime: now},
		{Type: v1.ContainersReady, Status: v1.ConditionTrue, LastTransitionTime: now},
		{Type: v1.PodInitialized, Status: v1.ConditionTrue, LastTransitionTime: now},
		{Type: v1.PodScheduled, Status: v1.ConditionTrue, LastTransitionTime: now},
	}
	_, err := k.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{FieldManager: kubeletFieldManager})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("set pod %s/%s running: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

// podVolumes returns the unique names of the Pod's volumes that need an
// attachment, and false while one of them cannot be resolved yet (PVC
// missing or unbound, PV missing): a kubelet would not start such a Pod.
// In-tree volumes of a plugin csi-translation-lib migrates (a PV's or an
// inline one) count as their CSI translation, as on a kubelet with CSI
// migration on.
func (k *Kubelet) podVolumes(pod *v1.Pod) ([]v1.UniqueVolumeName, bool) {
	var out []v1.UniqueVolumeName
	for _, vol := range pod.Spec.Volumes {
		if vol.PersistentVolumeClaim == nil {
			// Inline CSI (ephemeral) volumes are never attached; inline
			// in-tree volumes are when their plugin is migrated.
			if k.translator.IsInlineMigratable(&vol) {
				pv, err := k.translator.TranslateInTreeInlineVolumeToCSI(klog.Background(), &vol, pod.Namespace)
				if err != nil || pv == nil || pv.Spec.CSI == nil {
					return nil, false
				}
				out = append(out, UniqueVolumeName(pv.Spec.CSI.Driver, pv.Spec.CSI.VolumeHandle))
			}
			continue
		}
		pvc, err := k.pvcs.PersistentVolumeClaims(pod.Namespace).Get(vol.PersistentVolumeClaim.ClaimName)
		if err != nil || pvc.Spec.VolumeName == "" {
			return nil, false
		}
		pv, err := k.pvs.Get(pvc.Spec.VolumeName)
		if err != nil {
			return nil, false
		}
		if pv.Spec.CSI == nil && k.translator.IsPVMigratable(pv) {
			if pv, err = k.translator.TranslateInTreePVToCSI(klog.Background(), pv.DeepCopy()); err != nil || pv == nil {
				return nil, false
			}
		}
		if pv.Spec.CSI == nil {
			continue
		}
		if drv, err := k.csiDrvs.Get(pv.Spec.CSI.Driver); err == nil && drv.Spec.AttachRequired != nil && !*drv.Spec.AttachRequired {
			continue
		}
		out = append(out, UniqueVolumeName(pv.Spec.CSI.Driver, pv.Spec.CSI.VolumeHandle))
	}
	return out, true
}

// UniqueVolumeName is the name kubelet and the attach/detach controller use
// for a CSI volume in Node status.
func UniqueVolumeName(driver, handle string) v1.UniqueVolumeName {
	return v1.UniqueVolumeName("kubernetes.io/csi/" + driver + "^" + handle)
}

func (k *Kubelet) isStarted(pod *v1.Pod) bool {
	k.startedMu.Lock()
	defer k.startedMu.Unlock()
	// A Running Pod from before a stand-in restart counts as started.
	return k.started.Has(pod.UID) || pod.Status.Phase == v1.PodRunning
}

func (k *Kubelet) markStarted(uid types.UID) {
	k.startedMu.Lock()
	k.started.Insert(uid)
	k.startedMu.Unlock()
}

func (k *Kubelet) forgetStarted(uid types.UID) {
	k.startedMu.Lock()
	k.started.Delete(uid)
	k.startedMu.Unlock()
}
