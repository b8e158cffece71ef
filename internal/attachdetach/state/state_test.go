package state_test

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/latchcsi/latch/internal/attachdetach/state"
	"github.com/latchcsi/latch/internal/attachdetach/volume"
	"github.com/latchcsi/latch/internal/kube/kubenames"
)

func vol(handle string) volume.Attachable {
	a := volume.NewAttachable("d", handle)
	a.PVName = "pv-" + handle
	return a
}

func key(handle, node string) state.Key {
	return state.Key{Volume: vol(handle).UniqueName, Node: node}
}

var (
	podA = state.PodRef{Namespace: "ns", Name: "a", UID: "uid-a"}
	podB = state.PodRef{Namespace: "ns", Name: "b", UID: "uid-b"}
)

func TestDesiredPodsAndNodes(t *testing.T) {
	d := state.NewDesired()

	if _, ok := d.AddPod(podA, "n1", []volume.Attachable{vol("v1")}); ok {
		t.Fatal("pod on an unknown node was added")
	}
	d.AddNode("unmanaged", false)
	if _, ok := d.AddPod(podA, "unmanaged", []volume.Attachable{vol("v1")}); ok {
		t.Fatal("pod on an unmanaged node was added")
	}

	d.AddNode("n1", true)
	d.AddNode("n2", true)
	changed, ok := d.AddPod(podA, "n1", []volume.Attachable{vol("v1"), vol("v2")})
	if !ok || !reflect.DeepEqual(changed, []state.Key{key("v1", "n1"), key("v2", "n1")}) {
		t.Fatalf("AddPod = %v, %v", changed, ok)
	}
	d.AddPod(podB, "n2", []volume.Attachable{vol("v1")})

	if got := d.NodesWantingVolume(vol("v1").UniqueName); !reflect.DeepEqual(got, []string{"n1", "n2"}) {
		t.Errorf("NodesWantingVolume = %v", got)
	}
	if got := d.PodsWantingVolume(vol("v1").UniqueName, "n2"); !reflect.DeepEqual(got, []state.PodRef{podB}) {
		t.Errorf("PodsWantingVolume = %v", got)
	}
	if got := d.VolumesOnNode("n1"); len(got) != 2 || got[0].Volume.UniqueName != vol("v1").UniqueName || !reflect.DeepEqual(got[1].Pods, []state.PodRef{podA}) {
		t.Errorf("VolumesOnNode = %+v", got)
	}

	// Re-adding with fewer volumes (e.g. the pod terminated: none) drops them.
	changed, _ = d.AddPod(podA, "n1", []volume.Attachable{vol("v2")})
	if !reflect.DeepEqual(changed, []state.Key{key("v1", "n1"), key("v2", "n1")}) {
		t.Errorf("re-AddPod changed = %v", changed)
	}
	if _, ok := d.Get(key("v1", "n1")); ok {
		t.Error("v1 still wanted on n1")
	}
	changed, _ = d.AddPod(podA, "n1", nil)
	if !reflect.DeepEqual(changed, []state.Key{key("v2", "n1")}) || len(d.VolumesOnNode("n1")) != 0 {
		t.Errorf("terminated pod: changed = %v, volumes = %v", changed, d.VolumesOnNode("n1"))
	}

	if got := d.DeletePod(podB.UID); !reflect.DeepEqual(got, []state.Key{key("v1", "n2")}) {
		t.Errorf("DeletePod = %v", got)
	}
	if got := d.NodesWantingVolume(vol("v1").UniqueName); len(got) != 0 {
		t.Errorf("NodesWantingVolume after delete = %v", got)
	}
	if got := d.DeletePod(podB.UID); got != nil {
		t.Errorf("second DeletePod = %v", got)
	}
}

func TestDesiredSharedVolumeNeedsAllPodsGone(t *testing.T) {
	d := state.NewDesired()
	d.AddNode("n1", true)
	d.AddPod(podA, "n1", []volume.Attachable{vol("v1")})
	d.AddPod(podB, "n1", []volume.Attachable{vol("v1")})
	d.DeletePod(podA.UID)
	w, ok := d.Get(key("v1", "n1"))
	if !ok || !reflect.DeepEqual(w.Pods, []state.PodRef{podB}) {
		t.Errorf("Get = %+v, %v", w, ok)
	}
}

func TestDesiredNodeDeletedOrUnmanagedDropsItsVolumes(t *testing.T) {
	d := state.NewDesired()
	d.AddNode("n1", true)
	d.AddNode("n2", true)
	d.AddPod(podA, "n1", []volume.Attachable{vol("v1")})
	d.AddPod(podB, "n2", []volume.Attachable{vol("v2")})

	if got := d.DeleteNode("n1"); !reflect.DeepEqual(got, []state.Key{key("v1", "n1")}) {
		t.Errorf("DeleteNode = %v", got)
	}
	if d.NodeManaged("n1") || len(d.NodesWantingVolume(vol("v1").UniqueName)) != 0 {
		t.Error("n1 still known")
	}
	if d.MarkReported(podA.UID, "k") {
		t.Error("pod of a deleted node still known")
	}
	if got := d.AddNode("n2", false); !reflect.DeepEqual(got, []state.Key{key("v2", "n2")}) {
		t.Errorf("AddNode(unmanaged) = %v", got)
	}
	if _, ok := d.Get(key("v2", "n2")); ok {
		t.Error("v2 still wanted on an unmanaged node")
	}
}

func TestDesiredMarkReportedOncePerPod(t *testing.T) {
	d := state.NewDesired()
	d.AddNode("n1", true)
	d.AddPod(podA, "n1", []volume.Attachable{vol("v1")})
	if !d.MarkReported(podA.UID, "multi-attach/x") {
		t.Fatal("first report refused")
	}
	if d.MarkReported(podA.UID, "multi-attach/x") {
		t.Error("second report allowed")
	}
	// A pod update (AddPod again) keeps what was reported.
	d.AddPod(podA, "n1", []volume.Attachable{vol("v1")})
	if d.MarkReported(podA.UID, "multi-attach/x") {
		t.Error("report allowed again after a pod update")
	}
	// A re-created pod (new UID) is told again.
	d.DeletePod(podA.UID)
	if d.MarkReported(podA.UID, "multi-attach/x") {
		t.Error("deleted pod reported")
	}
}

func TestActualApplyAndMountedByNode(t *testing.T) {
	a := state.NewActual()
	k := key("v1", "n1")
	v := vol("v1")

	if !a.Apply(k, state.Update{State: state.StateAttaching, Spec: &v}) {
		t.Fatal("new entry not reported as a change")
	}
	e, _ := a.Get(k)
	if !e.MountedByNode {
		t.Error("new entry must be assumed mounted until the node reports")
	}
	if a.Apply(k, state.Update{State: state.StateAttaching}) {
		t.Error("no-op Apply reported a change")
	}
	if got := a.SetVolumesInUse("n1", nil); !reflect.DeepEqual(got, []state.Key{k}) {
		t.Errorf("SetVolumesInUse = %v", got)
	}
	e, _ = a.Get(k)
	if e.MountedByNode || e.Spec == nil || e.Spec.PVName != "pv-v1" {
		t.Errorf("entry = %+v", e)
	}
	if got := a.SetVolumesInUse("n1", nil); len(got) != 0 {
		t.Errorf("unchanged volumesInUse reported %v", got)
	}
	a.SetVolumesInUse("n1", []v1.UniqueVolumeName{k.Volume})
	e, _ = a.Get(k)
	if !e.MountedByNode {
		t.Error("volume in volumesInUse not mounted")
	}

	now := time.Unix(1000, 0)
	a.Apply(k, state.Update{State: state.StateAttached, ReportedInNodeStatus: true, DetachRequestedAt: now})
	e, _ = a.Get(k)
	if e.State != state.StateAttached || !e.ReportedInNodeStatus || !e.DetachRequestedAt.Equal(now) {
		t.Errorf("entry = %+v", e)
	}
	if got := a.ForNode("n1"); len(got) != 1 || got[0].Key != k {
		t.Errorf("ForNode = %v", got)
	}
	if !a.Apply(k, state.Update{Remove: true}) || a.Apply(k, state.Update{Remove: true}) {
		t.Error("Remove change reporting wrong")
	}
	if len(a.ForVolume(k.Volume)) != 0 || len(a.Keys()) != 0 {
		t.Error("entry not removed from indexes")
	}
}

func TestActualDeletedNodeKeepsLastVolumesInUse(t *testing.T) {
	a := state.NewActual()
	k := key("v1", "n1")
	a.Apply(k, state.Update{State: state.StateAttached, ReportedInNodeStatus: true})
	a.SetVolumesInUse("n1", []v1.UniqueVolumeName{k.Volume})
	a.DeleteNode("n1")
	if e, _ := a.Get(k); !e.MountedByNode {
		t.Error("a deleted node's last volumesInUse was dropped")
	}
	a.Apply(k, state.Update{Remove: true})
	// Once its last entry is gone, a node with the same name starts afresh.
	a.Apply(k, state.Update{State: state.StateAttaching})
	a.SetVolumesInUse("n1", nil)
	if e, _ := a.Get(k); e.MountedByNode {
		t.Error("stale volumesInUse")
	}
}

func TestActualRebuild(t *testing.T) {
	a := state.NewActual()
	attached := kubenames.UniqueVolumeName("d", "h-attached")
	unused := kubenames.UniqueVolumeName("d", "h-unused")
	node := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1"},
		Status: v1.NodeStatus{
			VolumesAttached: []v1.AttachedVolume{
				{Name: attached}, {Name: unused}, {Name: "kubernetes.io/iscsi/portal:iqn:0"},
			},
			VolumesInUse: []v1.UniqueVolumeName{attached},
		},
	}
	keys, err := a.AddFromNode(node)
	if !errors.Is(err, kubenames.ErrInvalidUniqueVolumeName) {
		t.Errorf("in-tree volume name: err = %v", err)
	}
	if len(keys) != 2 {
		t.Errorf("keys = %v", keys)
	}
	e, ok := a.Get(state.Key{Volume: attached, Node: "n1"})
	if !ok || e.State != state.StateAttached || !e.ReportedInNodeStatus || !e.MountedByNode || e.Spec != nil {
		t.Errorf("attached entry = %+v", e)
	}
	if e, _ := a.Get(state.Key{Volume: unused, Node: "n1"}); e.MountedByNode {
		t.Error("volume not in volumesInUse is mounted")
	}

	pv := &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pv-attached"},
		Spec:       v1.PersistentVolumeSpec{PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: "d", VolumeHandle: "h-attached"}}},
	}
	pv2 := pv.DeepCopy()
	pv2.Name, pv2.Spec.CSI.VolumeHandle = "pv-dangling", "h-dangling"
	va := func(name, pvName, node string) *storagev1.VolumeAttachment {
		return &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: storagev1.VolumeAttachmentSpec{
			Attacher: "d", NodeName: node, Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: ptr.To(pvName)},
		}}
	}
	objs := pvObjects{pv.Name: pv, pv2.Name: pv2}
	keys, err = a.AddFromVolumeAttachments(context.Background(), []*storagev1.VolumeAttachment{
		va("va1", "pv-attached", "n1"), // explained by the node status: stays attached, learns its spec
		va("va2", "pv-dangling", "n2"), // unexplained: uncertain
		va("va3", "pv-gone", "n1"),     // PV deleted: cannot be keyed
	}, volume.NewResolver(nil), objs)
	if !errors.Is(err, volume.ErrSourcePVNotFound) {
		t.Errorf("err = %v", err)
	}
	dangling := state.Key{Volume: kubenames.UniqueVolumeName("d", "h-dangling"), Node: "n2"}
	if !reflect.DeepEqual(keys, []state.Key{{Volume: attached, Node: "n1"}, dangling}) {
		t.Errorf("keys = %v", keys)
	}
	if e, _ := a.Get(state.Key{Volume: attached, Node: "n1"}); e.State != state.StateAttached || e.Spec == nil || e.Spec.PVName != "pv-attached" {
		t.Errorf("explained entry = %+v", e)
	}
	if e, _ := a.Get(dangling); e.State != state.StateUncertain || e.ReportedInNodeStatus || !e.MountedByNode {
		t.Errorf("dangling entry = %+v", e)
	}
}

type pvObjects map[string]*v1.PersistentVolume

func (p pvObjects) PersistentVolumeClaim(string, string) (*v1.PersistentVolumeClaim, bool) {
	return nil, false
}

func (p pvObjects) PersistentVolume(name string) (*v1.PersistentVolume, bool) {
	pv, ok := p[name]
	return pv, ok
}

func (p pvObjects) CSIDriver(string) (*storagev1.CSIDriver, bool) { return nil, false }
