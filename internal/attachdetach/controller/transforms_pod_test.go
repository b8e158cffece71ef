package controller

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/attachdetach/volume"
)

func trimmedPod(t *testing.T, p *v1.Pod) *v1.Pod {
	t.Helper()
	obj, err := trimPod(p)
	if err != nil {
		t.Fatal(err)
	}
	return obj.(*v1.Pod)
}

// A Pod keeps its container states only while it is being deleted, the
// one case volume.PodTerminated reads them; the Pod handler still tells
// every change that matters from one that does not, trimmed as whole.
func TestTrimPod_keepsContainerStatesOnlyWhileDeleting(t *testing.T) {
	deleted := metav1.NewTime(time.Date(2026, 11, 26, 6, 5, 0, 0, time.UTC))
	terminated := func(p *v1.Pod) {
		p.Status.ContainerStatuses[0].State = v1.ContainerState{Terminated: &v1.ContainerStateTerminated{ExitCode: 0}}
	}
	deleting := func(p *v1.Pod) { p.DeletionTimestamp = &deleted; p.DeletionGracePeriodSeconds = new(int64) }
	both := func(fs ...func(*v1.Pod)) func(*v1.Pod) {
		return func(p *v1.Pod) {
			for _, f := range fs {
				f(p)
			}
		}
	}
	for _, tc := range []struct {
		name       string
		old, pod   *v1.Pod
		wantStates bool
	}{
		{"running, a status update", fullPod(nil), fullPod(func(p *v1.Pod) { p.ResourceVersion = "43" }), false},
		{"a container terminated, the Pod not deleted", fullPod(nil), fullPod(terminated), false},
		{"deletion starts, a container still running", fullPod(nil), fullPod(deleting), true},
		{"deletion starts with every container terminated", fullPod(nil), fullPod(both(deleting, terminated)), true},
		{"being deleted, the last container terminates", fullPod(deleting), fullPod(both(deleting, terminated)), true},
		{"succeeded, then deleted", fullPod(func(p *v1.Pod) { p.Status.Phase = v1.PodSucceeded }),
			fullPod(both(deleting, func(p *v1.Pod) { p.Status.Phase = v1.PodSucceeded })), true},
		{"a container terminated, then deletion starts", fullPod(terminated), fullPod(both(deleting, terminated)), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old, got := trimmedPod(t, tc.old), trimmedPod(t, tc.pod)
			hasStates := got.Status.ContainerStatuses != nil || got.Status.InitContainerStatuses != nil
			if hasStates != tc.wantStates {
				t.Errorf("container states kept = %v, want %v: %+v", hasStates, tc.wantStates, got.Status)
			}
			if tc.wantStates && (len(got.Status.ContainerStatuses) != len(tc.pod.Status.ContainerStatuses) ||
				got.Status.ContainerStatuses[0].Name != tc.pod.Status.ContainerStatuses[0].Name) {
				t.Errorf("container states = %+v, want one per container of %+v", got.Status.ContainerStatuses, tc.pod.Status.ContainerStatuses)
			}
			if volume.PodTerminated(got) != volume.PodTerminated(tc.pod) || volume.PodNeedsVolumes(got) != volume.PodNeedsVolumes(tc.pod) {
				t.Errorf("PodTerminated/PodNeedsVolumes = %v/%v trimmed, %v/%v whole", volume.PodTerminated(got), volume.PodNeedsVolumes(got),
					volume.PodTerminated(tc.pod), volume.PodNeedsVolumes(tc.pod))
			}
			if podVolumesUnchanged(old, got) != podVolumesUnchanged(tc.old, tc.pod) {
				t.Errorf("podVolumesUnchanged = %v trimmed, %v whole", podVolumesUnchanged(old, got), podVolumesUnchanged(tc.old, tc.pod))
			}
			if got.DeletionGracePeriodSeconds != nil {
				t.Error("the deletion grace period, which nothing reads, was kept")
			}
			if !got.DeletionTimestamp.Equal(tc.pod.DeletionTimestamp) {
				t.Errorf("deletion timestamp %v, want %v", got.DeletionTimestamp, tc.pod.DeletionTimestamp)
			}
		})
	}
}
