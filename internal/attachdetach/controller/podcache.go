package controller

import (
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/latchcsi/latch/internal/attachdetach/state"
	"github.com/latchcsi/latch/internal/attachdetach/volume"
)

// cachedPod is what the Pod informer keeps of a Pod (its transform,
// TrimPod): the facts the controller reads, in a struct of its own. A
// trimmed *v1.Pod cost at least 1,280 bytes however much was cut (the
// struct is 1,192: PodSpec 568, PodStatus 360, ObjectMeta 232), and there
// is one Pod per volume; this record is 144 bytes before its volumes.
//
// It is not a runtime.Object: client-go's key function and store read its
// name, namespace and resourceVersion through GetObjectMeta. The store is
// read only through podStore, whose typed accessors are the one place that
// knows what it holds: nothing gets the informer's indexer to read *v1.Pods
// from it (a generated lister would panic on this type). Nothing in it may
// be written once it is in the store.
type cachedPod struct {
	namespace, name string
	uid             types.UID
	resourceVersion string
	// nodeName is spec.nodeName.
	nodeName string
	// volumes are the volumes of spec.volumes a CSI driver may attach
	// (every kind but emptyDir, secret, configMap, downwardAPI, projected,
	// hostPath and image), in spec order.
	volumes []v1.Volume
	// scheduled is when the Pod was scheduled, for the schedule-to-attach
	// metric: the PodScheduled condition's last transition to True, else
	// the creation time.
	scheduled time.Time
	// terminated is volume.PodTerminated of the Pod as listed: phase
	// Succeeded or Failed, or being deleted with no container running.
	// It is all the controller reads of the phase, the deletion time and
	// the container states.
	terminated bool
}

// TrimPod is the Pod informer's transform: a *v1.Pod becomes its
// cachedPod. A cachedPod (the watch-list reflector transforms each object
// once into its store and the queue's Replace again) and a tombstone (it
// holds an object trimmed when cached) are returned as they are. The Pod
// it is given is not changed.
func TrimPod(obj any) (any, error) {
	pod, ok := obj.(*v1.Pod)
	if !ok {
		return obj, nil
	}
	out := &cachedPod{
		namespace: intern(pod.Namespace), name: pod.Name, uid: pod.UID, resourceVersion: pod.ResourceVersion,
		nodeName: intern(pod.Spec.NodeName), scheduled: scheduledAt(pod), terminated: volume.PodTerminated(pod),
	}
	for _, v := range pod.Spec.Volumes {
		if mayBeAttachable(&v) {
			out.volumes = append(out.volumes, v)
		}
	}
	return out, nil
}

var _ cache.TransformFunc = TrimPod

// GetObjectMeta lets client-go's key function and store read the name,
// namespace, UID and resourceVersion (meta.Accessor accepts a
// metav1.ObjectMetaAccessor).
func (p *cachedPod) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Namespace: p.namespace, Name: p.name, UID: p.uid, ResourceVersion: p.resourceVersion}
}

// needsVolumes is volume.PodNeedsVolumes of the Pod: scheduled, with a
// volume that may be attachable, and not terminated.
func (p *cachedPod) needsVolumes() bool {
	return p.nodeName != "" && len(p.volumes) > 0 && !p.terminated
}

// ref is the Pod's identity in the desired state and in events.
func (p *cachedPod) ref() state.PodRef {
	return state.PodRef{Namespace: p.namespace, Name: p.name, UID: p.uid}
}

// asPod is the Pod the volume resolver reads: identity, node and the
// volumes (shared with the cache: the resolver only reads them).
func (p *cachedPod) asPod() *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: p.namespace, Name: p.name, UID: p.uid},
		Spec:       v1.PodSpec{NodeName: p.nodeName, Volumes: p.volumes},
	}
}

// scheduledAt is when pod was scheduled: its PodScheduled condition's last
// transition to True, else its creation time.
func scheduledAt(pod *v1.Pod) time.Time {
	for _, c := range pod.Status.Conditions {
		if c.Type == v1.PodScheduled && c.Status == v1.ConditionTrue && !c.LastTransitionTime.IsZero() {
			return c.LastTransitionTime.Time
		}
	}
	return pod.CreationTimestamp.Time
}

// podStore is the Pod informer's store read as what it holds: typed
// accessors for cachedPods. It is the only reader of that store.
type podStore struct{ indexer cache.Indexer }

// get reads Pod "namespace/name"; nil when it is not there.
func (s podStore) get(key string) (*cachedPod, error) {
	obj, exists, err := s.indexer.GetByKey(key)
	if err != nil || !exists {
		return nil, err
	}
	return asCachedPod(obj), nil
}

// list lists every Pod.
func (s podStore) list() []*cachedPod { return cachedPods(s.indexer.List()) }

// byIndex lists the Pods the index (indexes.go) files under value.
func (s podStore) byIndex(index, value string) ([]*cachedPod, error) {
	objs, err := s.indexer.ByIndex(index, value)
	if err != nil {
		return nil, err
	}
	return cachedPods(objs), nil
}

func cachedPods(objs []any) []*cachedPod {
	out := make([]*cachedPod, 0, len(objs))
	for _, obj := range objs {
		if p := asCachedPod(obj); p != nil {
			out = append(out, p)
		}
	}
	return out
}

// getPod reads Pod "namespace/name" from the informer's store; nil when
// it is not there.
func (c *Controller) getPod(key string) (*cachedPod, error) { return c.podStore.get(key) }

// listPods lists every Pod of the informer's store.
func (c *Controller) listPods() []*cachedPod { return c.podStore.list() }

// asCachedPod is obj as the Pod informer's store holds it; a *v1.Pod that
// did not go through the transform (a store filled by hand) is trimmed.
func asCachedPod(obj any) *cachedPod {
	switch p := obj.(type) {
	case *cachedPod:
		return p
	case *v1.Pod:
		t, _ := TrimPod(p)
		return t.(*cachedPod)
	}
	return nil
}
