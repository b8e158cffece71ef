package bench

import (
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// What-if shapes: attachdetach-controller's Pods and PVCs cut down to the
// fields the controller reads (internal/attachdetach: volume/pod.go,
// controller/pods.go, volume/resolve.go), as a transform would cut them.
// They are not what latch caches today; the benchmark prices them so that
// docs/scale.md can say what such a transform would save, measured rather
// than guessed.
var objWhatIf = map[string]map[string]func(runtime.Object){
	"attachdetach-controller": {"Pod": whatIfPod, "PVC": whatIfPVC},
}

// whatIfPod keeps the Pod's key, uid, resourceVersion, creation and
// deletion times, spec.nodeName, spec.volumes, status.phase, the
// PodScheduled condition and, of each container status, its state (running
// or not).
func whatIfPod(obj runtime.Object) {
	pod := obj.(*v1.Pod)
	pod.ObjectMeta = metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID,
		ResourceVersion: pod.ResourceVersion, CreationTimestamp: pod.CreationTimestamp, DeletionTimestamp: pod.DeletionTimestamp}
	pod.Spec = v1.PodSpec{NodeName: pod.Spec.NodeName, Volumes: pod.Spec.Volumes}
	var scheduled []v1.PodCondition
	for _, c := range pod.Status.Conditions {
		if c.Type == v1.PodScheduled {
			scheduled = []v1.PodCondition{{Type: c.Type, Status: c.Status, LastTransitionTime: c.LastTransitionTime}}
		}
	}
	states := func(in []v1.ContainerStatus) []v1.ContainerStatus {
		var out []v1.ContainerStatus
		for _, s := range in {
			out = append(out, v1.ContainerStatus{State: s.State})
		}
		return out
	}
	pod.Status = v1.PodStatus{Phase: pod.Status.Phase, Conditions: scheduled,
		InitContainerStatuses:      states(pod.Status.InitContainerStatuses),
		ContainerStatuses:          states(pod.Status.ContainerStatuses),
		EphemeralContainerStatuses: states(pod.Status.EphemeralContainerStatuses)}
}

// whatIfPVC keeps the claim's key, uid, resourceVersion, spec.volumeName
// and status.phase.
func whatIfPVC(obj runtime.Object) {
	pvc := obj.(*v1.PersistentVolumeClaim)
	pvc.ObjectMeta = metav1.ObjectMeta{Name: pvc.Name, Namespace: pvc.Namespace, UID: pvc.UID, ResourceVersion: pvc.ResourceVersion}
	pvc.Spec = v1.PersistentVolumeClaimSpec{VolumeName: pvc.Spec.VolumeName}
	pvc.Status = v1.PersistentVolumeClaimStatus{Phase: pvc.Status.Phase}
}
