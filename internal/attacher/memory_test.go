package attacher

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/latchcsi/latch/internal/testsupport/heap"
)

// The cluster of benchmark scenario C at one tenth of its size: our
// driver's PVs and VolumeAttachments, many more PVs of another driver, and
// Nodes whose CSINodes register both drivers. Objects carry what a real
// cluster's do (managed fields, provisioner annotations, claim references,
// the kubectl last-applied annotation on some), so the transform has
// something to drop.
const (
	memDriver      = "mem.csi.test"
	memOtherDriver = "other.csi.test"
	memOurs        = 500
	memForeign     = 5000
	memNodes       = 200
)

// BenchmarkInformerHeapPerObject fills the attacher's informers (the
// factory and transform RunSidecar uses, with the controller's indexers and
// handlers) from a fake clientset and reports the live heap they hold:
// heap-B/object over every cached object, and the same figure for a cache
// holding only other drivers' PVs (foreign-B/PV). Run with
//
//	go test -run='^$' -bench=InformerHeapPerObject -benchtime=1x ./internal/attacher/
func BenchmarkInformerHeapPerObject(b *testing.B) {
	for _, tc := range []struct {
		name                 string
		ours, foreign, nodes int
	}{
		{"mix", memOurs, memForeign, memNodes},
		{"foreign PVs only", 0, memForeign, 0},
	} {
		b.Run(tc.name, func(b *testing.B) {
			objs := memObjects(tc.ours, tc.foreign, tc.nodes)
			var perObject float64
			for b.Loop() {
				perObject = informerHeapPerObject(b, objs)
			}
			b.ReportMetric(perObject, "heap-B/object")
		})
	}
}

// informerHeapPerObject returns the live heap bytes per object held by
// synced attacher informers over objs.
func informerHeapPerObject(b *testing.B, objs []k8sruntime.Object) float64 {
	client := fake.NewClientset(objs...)
	before := heap.Live()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	factory := NewInformers(client, 0, memDriver)
	ctrl, err := New(Config{Driver: DriverInfo{Name: memDriver}, Workers: 1, Timeout: time.Second},
		client, factory, nil, record.NewFakeRecorder(10), nil)
	if err != nil {
		b.Fatal(err)
	}
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), ctrl.synced...) {
		b.Fatal("caches did not sync")
	}
	// Handlers run asynchronously after the sync; let them drain.
	time.Sleep(200 * time.Millisecond)
	after := heap.Live()
	perObject := float64(after-before) / float64(len(objs))
	runtime.KeepAlive(ctrl)
	cancel()
	factory.Shutdown()
	return perObject
}

func memObjects(ours, foreign, nodes int) []k8sruntime.Object {
	var objs []k8sruntime.Object
	for i := range nodes {
		name := fmt.Sprintf("node-%05d", i)
		objs = append(objs, &storagev1.CSINode{
			ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(fmt.Sprintf("0000-csinode-%05d", i)), ResourceVersion: "1",
				ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate}}},
			Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{
				{Name: memDriver, NodeID: name + "-id", TopologyKeys: []string{"topology.mem.csi.test/zone"}},
				{Name: memOtherDriver, NodeID: "i-0123456789abcdef-" + name, TopologyKeys: []string{"topology.other.csi.test/zone"}},
			}},
		})
	}
	for i := range foreign {
		objs = append(objs, memPV(fmt.Sprintf("pvc-other-%06d", i), memOtherDriver, i))
	}
	for i := range ours {
		pvName := fmt.Sprintf("pvc-ours-%06d", i)
		objs = append(objs, memPV(pvName, memDriver, i))
		node := fmt.Sprintf("node-%05d", i%max(nodes, 1))
		objs = append(objs, &storagev1.VolumeAttachment{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("csi-%064d", i), UID: types.UID(fmt.Sprintf("0000-va-%06d", i)), ResourceVersion: "1",
				ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate}}},
			Spec: storagev1.VolumeAttachmentSpec{Attacher: memDriver, NodeName: node,
				Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pvName}},
		})
	}
	return objs
}

func memPV(name, driver string, i int) *v1.PersistentVolume {
	pv := &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, UID: types.UID(fmt.Sprintf("0000-pv-%06d-%s", i, driver)), ResourceVersion: "1",
			Annotations:   map[string]string{"pv.kubernetes.io/provisioned-by": driver},
			Finalizers:    []string{"kubernetes.io/pv-protection"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "csi-provisioner", Operation: metav1.ManagedFieldsOperationUpdate}},
		},
		Spec: v1.PersistentVolumeSpec{
			AccessModes:                   []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			Capacity:                      v1.ResourceList{v1.ResourceStorage: resource.MustParse("10Gi")},
			PersistentVolumeReclaimPolicy: v1.PersistentVolumeReclaimDelete,
			StorageClassName:              "standard",
			ClaimRef: &v1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: "default",
				Name: "data-" + name, UID: types.UID("0000-pvc-" + name), ResourceVersion: "1"},
			PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{
				Driver: driver, VolumeHandle: "vol-" + name, FSType: "ext4",
				VolumeAttributes: map[string]string{"storage.kubernetes.io/csiProvisionerIdentity": "1700000000000-1234-" + driver},
			}},
		},
		Status: v1.PersistentVolumeStatus{Phase: v1.VolumeBound},
	}
	if i%2 == 0 {
		pv.Annotations["kubectl.kubernetes.io/last-applied-configuration"] = fmt.Sprintf(`{"apiVersion":"v1","kind":"PersistentVolume","metadata":{"name":%q},"spec":{"capacity":{"storage":"10Gi"},"csi":{"driver":%q,"volumeHandle":"vol-%s"}}}`, name, driver, name)
	}
	return pv
}
