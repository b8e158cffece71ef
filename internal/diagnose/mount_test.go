package diagnose

import (
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// mountPending makes Pod web wait for its volumes: Pending, scheduled
// scheduledAgo, its container in waiting (ContainerCreating is what the
// kubelet shows until the volumes are mounted).
func mountPending(scheduledAgo time.Duration, waiting string) func(*v1.Pod) {
	return func(p *v1.Pod) {
		p.Status.Phase = v1.PodPending
		p.Status.Conditions = []v1.PodCondition{{Type: v1.PodScheduled, Status: v1.ConditionTrue, LastTransitionTime: ago(scheduledAgo)}}
		p.Status.ContainerStatuses = []v1.ContainerStatus{{Name: "app", State: v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: waiting}}}}
	}
}

const failedMountMsg = `MountVolume.MountDevice failed for volume "pv-data" : rpc error: code = Internal desc = mkfs.ext4 failed: device /dev/xvdf busy`

// Issue 38: the attach is done (VolumeAttachment attached, the node lists
// the volume in volumesAttached) but the Pod does not start: latchctl no
// longer says "no problem found" but that the attach side is done, names
// the kubelet on the node as the next place to look, and shows the Pod's
// FailedMount events with their messages.
func TestExplainAttachedNotMounted(t *testing.T) {
	failedMount := func(objs []runtime.Object) []runtime.Object {
		return append(objs, newEvent("Pod", ns, "web", "FailedMount", failedMountMsg))
	}
	pending := func(scheduledAgo time.Duration, waiting string) []runtime.Object {
		return edit(healthy(), "web", mountPending(scheduledAgo, waiting))
	}
	kubelet := []string{"the attach side is done", "node " + nodeA + " lists " + string(kubenames.UniqueVolumeName(drv, handle)),
		"look at the kubelet on node " + nodeA, "kubectl describe pod -n app web", "journalctl -u kubelet"}
	runScenarios(t, []scenario{
		{
			name: "FailedMount on the Pod → problem naming the kubelet, and the event with its message",
			objs: failedMount(pending(10*time.Minute, "ContainerCreating")),
			want: []expect{
				{"va.attached", StatusOK, nil},
				{"node.volumesAttached", StatusOK, nil},
				{"pod.mount", StatusProblem, append(kubelet, "the kubelet reports FailedMount", "app ContainerCreating")},
				{"events", StatusInfo, []string{"Warning FailedMount x3", "mkfs.ext4 failed: device /dev/xvdf busy"}},
			},
		},
		{
			name: "another kubelet volume warning (a resize) counts too",
			objs: append(pending(time.Minute, "ContainerCreating"), newEvent("Pod", ns, "web", "FileSystemResizeFailed", "resize2fs failed")),
			want: []expect{{"pod.mount", StatusProblem, []string{"the kubelet reports FileSystemResizeFailed"}}, {"events", StatusInfo, []string{"resize2fs failed"}}},
		},
		{
			name:    "no event yet, 30s after scheduling → waiting, within the kubelet's mount timeout",
			objs:    pending(30*time.Second, "ContainerCreating"),
			want:    []expect{{"pod.mount", StatusWaiting, append(kubelet, "30s after the Pod was scheduled", "2m3s")}},
			healthy: true,
		},
		{
			name: "no event left, 10m after scheduling, no container status → problem",
			objs: edit(pending(10*time.Minute, ""), "web", func(p *v1.Pod) { p.Status.ContainerStatuses = nil }),
			want: []expect{{"pod.mount", StatusProblem, append(kubelet, "no container status yet", "longer than the kubelet's 2m3s mount timeout", "no kubelet event")}},
		},
		{
			name:    "image pull failing → the kubelet got past the mount: info, not a volume problem",
			objs:    pending(10*time.Minute, "ImagePullBackOff"),
			want:    []expect{{"pod.mount", StatusInfo, []string{"got past mounting", "app ImagePullBackOff"}}},
			healthy: true,
		},
		{
			name:    "Pod running → no mount finding",
			objs:    healthy(),
			absent:  []string{"pod.mount"},
			healthy: true,
		},
		{
			name: "node does not list the volume yet → the kubelet is not asked to mount: no mount finding",
			objs: edit(pending(10*time.Minute, "ContainerCreating"), nodeA, func(n *v1.Node) { n.Status.VolumesAttached = nil }),
			want: []expect{{"node.volumesAttached", StatusWaiting, nil}}, absent: []string{"pod.mount"}, healthy: true,
		},
		{
			name: "VolumeAttachment not attached → the attach is the step to look at, not the mount",
			objs: edit(pending(10*time.Minute, "ContainerCreating"), "", func(va *storagev1.VolumeAttachment) { va.Status.Attached = false }),
			want: []expect{{"va.attached", StatusWaiting, nil}}, absent: []string{"pod.mount"}, healthy: true,
		},
		{
			name:   "explain pvc → the same verdict for the Pod using it, with its events",
			target: Target{Kind: TargetPVC, Namespace: ns, Name: "data"},
			objs:   failedMount(pending(10*time.Minute, "ContainerCreating")),
			want:   []expect{{"pod.mount", StatusProblem, kubelet}, {"events", StatusInfo, []string{"mkfs.ext4 failed"}}},
		},
		{
			name:   "explain va → the same verdict",
			target: Target{Kind: TargetVA, Name: kubenames.VolumeAttachmentName(handle, drv, nodeA)},
			objs:   failedMount(pending(10*time.Minute, "ContainerCreating")),
			want:   []expect{{"pod.mount", StatusProblem, kubelet}},
		},
	})
}

// Events that cannot be read: the verdict still names the kubelet and
// says the events could not be read instead of "no event is left".
func TestExplainAttachedNotMountedEventsUnreadable(t *testing.T) {
	s := NewSnapshot(now, edit(healthy(), "web", mountPending(10*time.Minute, "ContainerCreating"))...)
	s.Unreadable[Ref{Kind: RefEventList, Of: RefPod, Namespace: ns, Name: "web"}] = "forbidden"
	r := Explain(podWeb, s)
	checkExpect(t, r, expect{"pod.mount", StatusProblem, []string{"look at the kubelet on node " + nodeA, "could not be read"}})
	if strings.Contains(r.Summary(), "no problem found") {
		t.Errorf("summary %q", r.Summary())
	}
}
