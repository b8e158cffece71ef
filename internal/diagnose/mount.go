package diagnose

import (
	"fmt"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// kubeletMountTimeout is how long the kubelet waits for a Pod's volumes
// to be attached and mounted before it records FailedMount ("Unable to
// attach or mount volumes: ... timed out waiting for the condition") and
// starts waiting again (kubelet's podAttachAndMountTimeout).
const kubeletMountTimeout = 2*time.Minute + 3*time.Second

// kubeletVolumeWarnings are the reasons of the kubelet's Warning events
// about a Pod's volumes on its node (mount, block-device map, resize).
func kubeletVolumeWarnings() []string {
	return []string{"FailedMount", "FailedMapVolume", "FileSystemResizeFailed", "VolumeResizeFailed",
		"AlreadyMountedVolume", "FailedMountOnFilesystemMismatch"}
}

// explainMount follows the volume past the attach: once the
// VolumeAttachment is attached and the node lists the volume in
// status.volumesAttached, the attach side is done and the kubelet of that
// node mounts it. A Pod that wants the volume there and has not started
// its containers waits for that mount: the kubelet, not the attach
// pipeline, is the next place to look.
func (w *walker) explainMount(a *attachment) {
	va, n := a.va, a.nodeObj
	if va == nil || !va.Status.Attached || va.DeletionTimestamp != nil || va.Spec.Attacher != a.vol.driver || n == nil {
		return
	}
	u := kubenames.UniqueVolumeName(a.vol.driver, a.vol.handle)
	if !slices.ContainsFunc(n.Status.VolumesAttached, func(av v1.AttachedVolume) bool { return av.Name == u }) {
		return
	}
	for _, pod := range a.wantedPods {
		if pod.DeletionTimestamp != nil {
			continue
		}
		obj := "Pod " + key(pod.Namespace, pod.Name)
		waiting, past := containersWaiting(pod)
		switch {
		case past != "":
			w.add(Finding{Check: "pod.mount", Object: obj, Status: StatusInfo,
				Message: fmt.Sprintf("the volume is attached to node %s and the kubelet got past mounting it: the Pod waits for something else (%s)", a.node, past)})
			continue
		case !waiting:
			continue
		}
		warnings, readable := w.volumeWarnings(pod)
		since := scheduledAt(pod)
		f := Finding{Check: "pod.mount", Object: obj,
			Message: fmt.Sprintf("the attach side is done (VolumeAttachment %s attached, node %s lists %s in status.volumesAttached), but the Pod has not started its containers (%s): the kubelet on node %s has not mounted the volume",
				va.Name, a.node, u, describeContainers(pod), a.node),
			Hint: fmt.Sprintf("look at the kubelet on node %s, not at the attach: the Pod's events (kubectl describe pod -n %s %s), the kubelet's log on %s (journalctl -u kubelet | grep %s) and driver %s's node plugin Pod on %s (kubectl get pods -A -o wide --field-selector spec.nodeName=%s; its NodeStageVolume/NodePublishVolume errors)",
				a.node, pod.Namespace, pod.Name, a.node, a.vol.handle, a.vol.driver, a.node, a.node)}
		waited := w.s.Now.Sub(since)
		within := !since.IsZero() && waited <= kubeletMountTimeout
		switch {
		case len(warnings) > 0:
			f.Status = StatusProblem
			f.Message += fmt.Sprintf("; the kubelet reports %s (below)", strings.Join(warnings, ", "))
		case within:
			f.Status = StatusWaiting
			f.Message += fmt.Sprintf(" yet, %s after the Pod was scheduled; the kubelet reports FailedMount when it has not after %s", HumanDuration(waited), HumanDuration(kubeletMountTimeout))
		case !readable:
			f.Status = StatusProblem
			f.Message += fmt.Sprintf(", longer than the kubelet's %s mount timeout; the Pod's events could not be read", HumanDuration(kubeletMountTimeout))
		default:
			f.Status = StatusProblem
			f.Message += fmt.Sprintf(", longer than the kubelet's %s mount timeout, and no kubelet event about it is left (events expire after an hour)", HumanDuration(kubeletMountTimeout))
		}
		w.add(f)
		w.explainEvents(RefPod, pod.Namespace, pod.Name, obj, podEventReasons())
	}
}

// volumeWarnings returns the reasons of the kubelet's Warning events about
// the Pod's volumes, each once, in order of first appearance; readable is
// false when the events could not be read.
func (w *walker) volumeWarnings(pod *v1.Pod) (reasons []string, readable bool) {
	evs, ref := w.events(RefPod, pod.Namespace, pod.Name)
	if _, refused := w.unreadable(ref); refused {
		return nil, false
	}
	for _, e := range evs {
		if e.Type == v1.EventTypeWarning && slices.Contains(kubeletVolumeWarnings(), e.Reason) && !slices.Contains(reasons, e.Reason) {
			reasons = append(reasons, e.Reason)
		}
	}
	return reasons, true
}

// containersWaiting reports whether the Pod is Pending with no container
// started and none waiting for a reason that comes after the mount: the
// kubelet mounts every volume before it pulls images and starts
// containers. past describes the containers when the kubelet got past
// the mount (an image pull failing, a container crashing) while the Pod
// is not Running.
func containersWaiting(pod *v1.Pod) (waiting bool, past string) {
	if pod.Status.Phase != v1.PodPending {
		return false, ""
	}
	for _, cs := range slices.Concat(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses) {
		started := cs.State.Running != nil || cs.State.Terminated != nil || cs.LastTerminationState.Terminated != nil
		reason := ""
		if cs.State.Waiting != nil {
			reason = cs.State.Waiting.Reason
		}
		if started || (reason != "" && reason != "ContainerCreating" && reason != "PodInitializing") {
			return false, describeContainers(pod)
		}
	}
	return true, ""
}

// describeContainers is "phase Pending; app: ContainerCreating, ..." or
// "phase Pending; no container status yet".
func describeContainers(pod *v1.Pod) string {
	var states []string
	for _, cs := range slices.Concat(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses) {
		state := "waiting"
		switch {
		case cs.State.Running != nil:
			state = "running"
		case cs.State.Terminated != nil:
			state = "terminated: " + cs.State.Terminated.Reason
		case cs.State.Waiting != nil && cs.State.Waiting.Reason != "":
			state = cs.State.Waiting.Reason
		}
		states = append(states, cs.Name+" "+state)
	}
	if len(states) == 0 {
		states = []string{"no container status yet"}
	}
	return fmt.Sprintf("phase %s; %s", pod.Status.Phase, strings.Join(states, ", "))
}

// scheduledAt is when the Pod was bound to its node (its PodScheduled
// condition), else its creation.
func scheduledAt(pod *v1.Pod) time.Time {
	for _, c := range pod.Status.Conditions {
		if c.Type == v1.PodScheduled && c.Status == v1.ConditionTrue && !c.LastTransitionTime.IsZero() {
			return c.LastTransitionTime.Time
		}
	}
	return pod.CreationTimestamp.Time
}
