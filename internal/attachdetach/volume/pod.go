package volume

import (
	"context"

	v1 "k8s.io/api/core/v1"
)

// PodNeedsVolumes reports whether the controller should attach the volumes
// of pod: it is scheduled and not terminated. A terminated pod's volumes
// are no longer desired even before the pod object is deleted, so its node
// may detach them (upstream: util.IsPodTerminated via
// DetermineVolumeAction).
func PodNeedsVolumes(pod *v1.Pod) bool {
	return pod.Spec.NodeName != "" && len(pod.Spec.Volumes) > 0 && !PodTerminated(pod)
}

// PodTerminated is upstream's definition: phase Succeeded or Failed, or
// being deleted with no container running any more.
func PodTerminated(pod *v1.Pod) bool {
	switch pod.Status.Phase {
	case v1.PodSucceeded, v1.PodFailed:
		return true
	}
	return pod.DeletionTimestamp != nil &&
		notRunning(pod.Status.InitContainerStatuses) &&
		notRunning(pod.Status.ContainerStatuses) &&
		notRunning(pod.Status.EphemeralContainerStatuses)
}

func notRunning(statuses []v1.ContainerStatus) bool {
	for _, s := range statuses {
		if s.State.Terminated == nil && s.State.Waiting == nil {
			return false
		}
	}
	return true
}

// ResolvePod resolves every volume of pod, in pod spec order. The caller
// adds the StatusAttach ones to the desired state and remembers the
// StatusPending ones to re-resolve when the named objects change.
func (r *Resolver) ResolvePod(ctx context.Context, pod *v1.Pod, objs Objects) []Result {
	out := make([]Result, 0, len(pod.Spec.Volumes))
	for i := range pod.Spec.Volumes {
		out = append(out, r.Resolve(ctx, pod, &pod.Spec.Volumes[i], objs))
	}
	return out
}

// Attachables returns the attachable volumes among results, without
// duplicates (two pod volumes may resolve to the same CSI volume).
func Attachables(results []Result) []Attachable {
	var out []Attachable
	seen := map[v1.UniqueVolumeName]bool{}
	for _, r := range results {
		if r.Status != StatusAttach || seen[r.Volume.UniqueName] {
			continue
		}
		seen[r.Volume.UniqueName] = true
		out = append(out, r.Volume)
	}
	return out
}
