package controller

import (
	"testing"
	"time"
	"unsafe"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/latchcsi/latch/internal/attachdetach/volume"
)

func trimmedPod(t *testing.T, p *v1.Pod) *cachedPod {
	t.Helper()
	obj, err := TrimPod(p)
	if err != nil {
		t.Fatal(err)
	}
	return obj.(*cachedPod)
}

// Whether a Pod terminated is decided from the whole Pod, in every state
// volume.PodTerminated reads (phase, deletion, each kind of container),
// and the Pod handler tells every change that matters from one that does
// not as it would on the whole Pods.
func TestTrimPod_decidesTerminatedFromTheWholePod(t *testing.T) {
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
	wholeUnchanged := func(old, pod *v1.Pod) bool {
		return old.Spec.NodeName == pod.Spec.NodeName && volume.PodNeedsVolumes(old) == volume.PodNeedsVolumes(pod)
	}
	for _, tc := range []struct {
		name           string
		old, pod       *v1.Pod
		wantTerminated bool
	}{
		{"running, a status update", fullPod(nil), fullPod(func(p *v1.Pod) { p.ResourceVersion = "43" }), false},
		{"a container terminated, the Pod not deleted", fullPod(nil), fullPod(terminated), false},
		{"deletion starts, a container still running", fullPod(nil), fullPod(deleting), false},
		{"deletion starts with every container terminated", fullPod(nil), fullPod(both(deleting, terminated)), true},
		{"being deleted, the last container terminates", fullPod(deleting), fullPod(both(deleting, terminated)), true},
		{"succeeded, then deleted", fullPod(func(p *v1.Pod) { p.Status.Phase = v1.PodSucceeded }),
			fullPod(both(deleting, func(p *v1.Pod) { p.Status.Phase = v1.PodSucceeded })), true},
		{"a container terminated, then deletion starts", fullPod(terminated), fullPod(both(deleting, terminated)), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old, got := trimmedPod(t, tc.old), trimmedPod(t, tc.pod)
			if got.terminated != tc.wantTerminated || got.terminated != volume.PodTerminated(tc.pod) {
				t.Errorf("terminated = %v, want %v (PodTerminated of the whole Pod: %v)", got.terminated, tc.wantTerminated, volume.PodTerminated(tc.pod))
			}
			if got.needsVolumes() != volume.PodNeedsVolumes(tc.pod) {
				t.Errorf("needsVolumes = %v, PodNeedsVolumes of the whole Pod %v", got.needsVolumes(), volume.PodNeedsVolumes(tc.pod))
			}
			if podVolumesUnchanged(old, got) != wholeUnchanged(tc.old, tc.pod) {
				t.Errorf("podVolumesUnchanged = %v trimmed, %v whole", podVolumesUnchanged(old, got), wholeUnchanged(tc.old, tc.pod))
			}
		})
	}
}

// The record is what client-go's store needs (its key and
// resourceVersion through GetObjectMeta) and small: a fraction of the
// 1,192-byte *v1.Pod struct it replaces.
func TestCachedPod_isKeyedLikeItsPodAndSmall(t *testing.T) {
	got := trimmedPod(t, fullPod(nil))
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(got)
	if err != nil || key != testNS+"/app" {
		t.Fatalf("key = %q, %v; want %q", key, err, testNS+"/app")
	}
	store := cache.NewStore(cache.DeletionHandlingMetaNamespaceKeyFunc)
	if err := store.Add(got); err != nil {
		t.Fatal(err)
	}
	if obj, ok, _ := store.GetByKey(testNS + "/app"); !ok || obj != any(got) {
		t.Fatalf("store lookup = %v, %v", obj, ok)
	}
	if m := got.GetObjectMeta(); m.GetResourceVersion() != "42" || m.GetUID() != "app-uid" {
		t.Errorf("object meta = %+v, want resourceVersion 42 and UID app-uid", m)
	}
	if size := unsafe.Sizeof(cachedPod{}); size > 160 {
		t.Errorf("cachedPod is %d bytes, want at most 160", size)
	}
	// A Pod the transform never saw (a store filled by hand) reads the same.
	if p := asCachedPod(fullPod(nil)); p == nil || p.name != "app" || p.nodeName != "node-a" || len(p.volumes) != 4 {
		t.Errorf("asCachedPod of a *v1.Pod = %+v", p)
	}
}
