package volume

import (
	"context"
	"slices"

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

// Attachables returns the attachable volumes among results, in pod spec
// order, each spec once. Two pod volumes may resolve to the same CSI
// volume: through one PVC (the same spec: kept once), or through two PVs
// or a PV and an inline volume that name one driver and volume handle.
// Those are different specs of one unique volume and are all returned,
// because each may say something different about it (one PV ReadWriteMany,
// the other ReadWriteOnce): the desired state keeps every one, and the
// multi-attach rule looks at all of them, whatever their order in the Pod.
// kube-controller-manager keeps only the first it resolves.
func Attachables(results []Result) []Attachable {
	var out []Attachable
	for _, r := range results {
		if r.Status != StatusAttach || slices.ContainsFunc(out, func(a Attachable) bool { return SameSpec(a, r.Volume) }) {
			continue
		}
		out = append(out, r.Volume)
	}
	return out
}

// SameSpec reports whether a and b are the same spec of the same unique
// volume for attach and multi-attach: the same PV (or inline volume) with
// the same access modes. Fields only informational (ReadOnly) do not
// count.
func SameSpec(a, b Attachable) bool {
	return a.UniqueName == b.UniqueName && a.PVName == b.PVName && a.SpecName == b.SpecName &&
		(a.InlineSpec == nil) == (b.InlineSpec == nil) && slices.Equal(a.AccessModes, b.AccessModes)
}
