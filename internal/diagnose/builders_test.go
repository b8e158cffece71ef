package diagnose

import (
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// Builders for scenario tests. Every object starts healthy; options break
// exactly one thing so that a scenario reads as its cause.

const (
	drv    = "csi.example.com"
	ns     = "app"
	nodeA  = "node-a"
	nodeB  = "node-b"
	pvName = "pv-data"
	handle = "vol-1234"
)

var now = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

func ago(d time.Duration) metav1.Time { return metav1.NewTime(now.Add(-d)) }
func agoPtr(d time.Duration) *metav1.Time {
	t := ago(d)
	return &t
}

// newPod is a Pod whose container runs: its volumes are mounted.
func newPod(name, node string, claims ...string) *v1.Pod {
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name), CreationTimestamp: ago(time.Hour)},
		Spec:       v1.PodSpec{NodeName: node, Containers: []v1.Container{{Name: "app"}}},
		Status: v1.PodStatus{Phase: v1.PodRunning, ContainerStatuses: []v1.ContainerStatus{{Name: "app", Ready: true,
			State: v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: ago(time.Hour)}}}}},
	}
	for _, c := range claims {
		p.Spec.Volumes = append(p.Spec.Volumes, v1.Volume{Name: "v-" + c,
			VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: c}}})
	}
	return p
}

func newPVC(name, volume string, modes ...v1.PersistentVolumeAccessMode) *v1.PersistentVolumeClaim {
	c := &v1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-pvc-" + name)},
		Spec:       v1.PersistentVolumeClaimSpec{VolumeName: volume, AccessModes: modes},
		Status:     v1.PersistentVolumeClaimStatus{Phase: v1.ClaimBound},
	}
	if volume == "" {
		c.Status.Phase = v1.ClaimPending
	}
	return c
}

func newPV(name, claim string, modes ...v1.PersistentVolumeAccessMode) *v1.PersistentVolume {
	if len(modes) == 0 {
		modes = []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}
	}
	return &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.PersistentVolumeSpec{
			AccessModes: modes,
			ClaimRef:    &v1.ObjectReference{Namespace: ns, Name: claim, UID: types.UID("uid-pvc-" + claim)},
			PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{
				Driver: drv, VolumeHandle: handle}},
		},
		Status: v1.PersistentVolumeStatus{Phase: v1.VolumeBound},
	}
}

func newNode(name string, attached, inUse bool) *v1.Node {
	n := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{kubenames.ControllerManagedAttachAnnotation: "true"}},
		Status: v1.NodeStatus{Conditions: []v1.NodeCondition{{
			Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady", LastTransitionTime: ago(time.Hour)}}},
	}
	u := kubenames.UniqueVolumeName(drv, handle)
	if attached {
		n.Status.VolumesAttached = []v1.AttachedVolume{{Name: u}}
	}
	if inUse {
		n.Status.VolumesInUse = []v1.UniqueVolumeName{u}
	}
	return n
}

func newCSINode(name string, drivers ...string) *storagev1.CSINode {
	cn := &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for _, d := range drivers {
		cn.Spec.Drivers = append(cn.Spec.Drivers, storagev1.CSINodeDriver{Name: d, NodeID: d + "/" + name})
	}
	return cn
}

func newCSIDriver(attachRequired bool) *storagev1.CSIDriver {
	return &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: drv},
		Spec: storagev1.CSIDriverSpec{AttachRequired: &attachRequired}}
}

func newVA(node string, attached bool) *storagev1.VolumeAttachment {
	pv := pvName
	return &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{
			Name:              kubenames.VolumeAttachmentName(handle, drv, node),
			CreationTimestamp: ago(10 * time.Minute),
			Finalizers:        []string{kubenames.AttacherFinalizer(drv)},
		},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: drv, NodeName: node,
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv},
		},
		Status: storagev1.VolumeAttachmentStatus{Attached: attached},
	}
}

func newLease(namespace string, renewedAgo time.Duration) *coordinationv1.Lease {
	holder, secs := "attacher-0", int32(15)
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: kube.LeaseName(drv)},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &secs,
			RenewTime: &metav1.MicroTime{Time: now.Add(-renewedAgo)}},
	}
}

func newEvent(kind, namespace, name, reason, msg string) *v1.Event {
	return &v1.Event{
		ObjectMeta:     metav1.ObjectMeta{Namespace: "default", Name: name + "." + reason},
		InvolvedObject: v1.ObjectReference{Kind: kind, Namespace: namespace, Name: name},
		Type:           v1.EventTypeWarning, Reason: reason, Message: msg, Count: 3,
		LastTimestamp: ago(time.Minute),
	}
}

// healthy is a Pod on node-a whose RWO volume is attached and in use.
func healthy() []runtime.Object {
	return []runtime.Object{
		newPod("web", nodeA, "data"),
		newPVC("data", pvName, v1.ReadWriteOnce),
		newPV(pvName, "data"),
		newCSIDriver(true),
		newNode(nodeA, true, true),
		newCSINode(nodeA, drv),
		newVA(nodeA, true),
		newLease("kube-system", 5*time.Second),
	}
}

// edit applies fn to every object of type T (matching name, if not "").
func edit[T runtime.Object](objs []runtime.Object, name string, fn func(T)) []runtime.Object {
	for _, o := range objs {
		if t, ok := o.(T); ok && (name == "" || nameOf(o) == name) {
			fn(t)
		}
	}
	return objs
}

// drop removes every object of type T (matching name, if not "").
func drop[T runtime.Object](objs []runtime.Object, name string) []runtime.Object {
	out := objs[:0:0]
	for _, o := range objs {
		if _, ok := o.(T); ok && (name == "" || nameOf(o) == name) {
			continue
		}
		out = append(out, o)
	}
	return out
}

func nameOf(o runtime.Object) string {
	if m, ok := o.(metav1.Object); ok {
		return m.GetName()
	}
	return ""
}
