package controller

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/latchcsi/latch/internal/attachdetach/decide"
)

const (
	gcePDPlugin = "kubernetes.io/gce-pd"
	gcePDDriver = "pd.csi.storage.gke.io"
)

var csiNodeResource = storagev1.SchemeGroupVersion.WithResource("csinodes")

// inTreeGCEClaim returns an in-tree GCE PD PV (disk = name, zone
// us-central1-a) bound to a PVC of the same name, and the CSI volume
// handle csi-translation-lib gives it.
func inTreeGCEClaim(name string) (*v1.PersistentVolume, *v1.PersistentVolumeClaim, string) {
	pv, pvc := boundClaim(name, v1.ReadWriteOnce)
	pv.Labels = map[string]string{v1.LabelTopologyZone: "us-central1-a"}
	pv.Spec.PersistentVolumeSource = v1.PersistentVolumeSource{GCEPersistentDisk: &v1.GCEPersistentDiskVolumeSource{PDName: name}}
	pv.Spec.Capacity = v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")}
	return pv, pvc, "projects/UNSPECIFIED/zones/us-central1-a/disks/" + name
}

func csiNode(name string, annotations map[string]string) *storagev1.CSINode {
	return &storagev1.CSINode{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(name + "-csinode-uid"), Annotations: annotations,
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}},
		Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{Name: gcePDDriver, NodeID: name + "-id", TopologyKeys: []string{"topology.gke.io/zone"}}}},
	}
}

// updateCSINode plays the kubelet: replaces the CSINode's annotations and
// drivers.
func (w *fakeWorld) updateCSINode(cn *storagev1.CSINode) {
	w.t.Helper()
	if err := w.tracker.Update(csiNodeResource, cn, "", metav1.UpdateOptions{FieldManager: "kubelet"}); err != nil {
		w.t.Fatal(err)
	}
}

// csiNodeSeen waits until the controller's CSINode cache shows the
// migrated-plugins annotation value want ("" and no CSINode alike when
// exists is false), then until the queues are idle.
func (w *fakeWorld) csiNodeSeen(name string, exists bool, want string) {
	w.t.Helper()
	w.eventually("CSINode "+name+" in the controller's cache", func() bool {
		cn, err := w.c.csiNodeLister.Get(name)
		if !exists {
			return err != nil
		}
		return err == nil && cn.Annotations[v1.MigratedPluginsAnnotationKey] == want
	})
	w.settle()
}

func (w *fakeWorld) waitingForMigration() map[string]float64 {
	w.t.Helper()
	out := map[string]float64{}
	for _, s := range w.gaugeSamples(WaitingForMigrationMetric) {
		if p, ok := s.labels["plugin"]; ok && s.value != 0 {
			out[p] = s.value
		}
	}
	return out
}

func TestMigrationByNode_nodeWithoutAnnotationWaitsWithOneWarning_annotationAddedAttaches_removedKeepsAttachment(t *testing.T) {
	pv, pvc, handle := inTreeGCEClaim("disk-1")
	cn := csiNode("node-a", nil)
	w := newFakeWorld(t, Config{Workers: 2, MigrationByNode: []string{gcePDPlugin}},
		managedNode("node-a"), cn, pv, pvc, podUsing("app", "node-a", "disk-1"))
	name := upstreamVAName(handle, gcePDDriver, "node-a")

	// Not migrated on the node: no VolumeAttachment, one Warning naming
	// the volume, the plugin, the node and the annotation.
	w.eventually("FailedAttachVolume event", func() bool { return len(w.events.Events) > 0 })
	w.settle()
	wantEvent := "Warning FailedAttachVolume " + decide.NotMigratedMessage("disk-1", gcePDPlugin, "node-a", true)
	if evs := w.recorded(); !slices.Equal(evs, []string{wantEvent}) {
		t.Fatalf("events = %q, want %q", evs, wantEvent)
	}
	for _, part := range []string{`"disk-1"`, gcePDPlugin, "node-a", v1.MigratedPluginsAnnotationKey} {
		if !strings.Contains(wantEvent, part) {
			t.Errorf("event %q does not name %s", wantEvent, part)
		}
	}
	w.noNewWrites(0, 200*time.Millisecond, "node has not migrated the plugin")
	if got := w.waitingForMigration(); !maps.Equal(got, map[string]float64{gcePDPlugin: 1}) {
		t.Errorf("%s = %v, want 1 for %s", WaitingForMigrationMetric, got, gcePDPlugin)
	}

	// The informer keeps only what the controller reads.
	cached, err := w.c.csiNodeLister.Get("node-a")
	if err != nil {
		t.Fatal(err)
	}
	if len(cached.Spec.Drivers) != 0 || cached.ManagedFields != nil || cached.UID != "" || cached.ResourceVersion == "" {
		t.Errorf("cached CSINode = %+v, want name, resourceVersion and the annotation only", cached)
	}

	// A kubelet rewrite that leaves the annotation alone (another
	// driver, or other plugins listed) changes nothing: no write, no
	// second event.
	cn = cn.DeepCopy()
	cn.Spec.Drivers = append(cn.Spec.Drivers, storagev1.CSINodeDriver{Name: "other.csi.example.com", NodeID: "x"})
	w.updateCSINode(cn)
	w.eventually("driver change in the cache", func() bool {
		c, err := w.c.csiNodeLister.Get("node-a")
		return err == nil && c.ResourceVersion != cached.ResourceVersion
	})
	cn = cn.DeepCopy()
	cn.Annotations = map[string]string{v1.MigratedPluginsAnnotationKey: "kubernetes.io/aws-ebs"}
	w.updateCSINode(cn)
	w.csiNodeSeen("node-a", true, "kubernetes.io/aws-ebs")
	w.noNewWrites(0, 100*time.Millisecond, "annotation lists other plugins")
	if evs := w.recorded(); len(evs) != 0 {
		t.Errorf("events after CSINode changes that keep the condition = %q, want none", evs)
	}

	// The kubelet migrates the plugin: the VolumeAttachment is created at
	// once (no timer, no backoff) and the volume attaches.
	cn = cn.DeepCopy()
	cn.Annotations[v1.MigratedPluginsAnnotationKey] = "kubernetes.io/aws-ebs," + gcePDPlugin
	w.updateCSINode(cn)
	if got := w.waitWrites(1); !slices.Equal(got, []string{"create volumeattachments " + name}) {
		t.Fatalf("writes after the annotation = %q, want the create of %s", got, name)
	}
	va, _ := w.va(name)
	if va.Spec.Attacher != gcePDDriver || va.Spec.NodeName != "node-a" || va.Spec.Source.PersistentVolumeName == nil || *va.Spec.Source.PersistentVolumeName != "disk-1" {
		t.Errorf("VolumeAttachment spec = %+v", va.Spec)
	}
	vol := v1.UniqueVolumeName("kubernetes.io/csi/" + gcePDDriver + "^" + handle)
	w.attachConfirmed(name, "node-a", vol, "disk-1")
	if got := w.waitingForMigration(); len(got) != 0 {
		t.Errorf("%s after the attach = %v, want none", WaitingForMigrationMetric, got)
	}

	// The node stops listing the plugin, then loses its CSINode: the
	// attachment is kept, nothing is written, no event.
	cn = cn.DeepCopy()
	delete(cn.Annotations, v1.MigratedPluginsAnnotationKey)
	w.updateCSINode(cn)
	w.csiNodeSeen("node-a", true, "")
	if err := w.tracker.Delete(csiNodeResource, "", "node-a"); err != nil {
		t.Fatal(err)
	}
	w.csiNodeSeen("node-a", false, "")
	w.noNewWrites(2, 200*time.Millisecond, "attached volume on a node that stopped listing the plugin")
	if evs := w.recorded(); len(evs) != 0 {
		t.Errorf("events = %q, want none", evs)
	}
	if _, ok := w.va(name); !ok {
		t.Error("VolumeAttachment deleted")
	}
}

func TestMigrationByNode_off_inTreeVolumeAttachesWithoutCSINode(t *testing.T) {
	pv, pvc, handle := inTreeGCEClaim("disk-1")
	w := newFakeWorld(t, Config{Workers: 2}, managedNode("node-a"), pv, pvc, podUsing("app", "node-a", "disk-1"))
	name := upstreamVAName(handle, gcePDDriver, "node-a")
	if got := w.waitWrites(1); !slices.Equal(got, []string{"create volumeattachments " + name}) {
		t.Fatalf("writes = %q, want the create of %s", got, name)
	}
	if evs := w.recorded(); len(evs) != 0 {
		t.Errorf("events = %q, want none", evs)
	}
}

func TestMigrationByNode_deletedCSINodeOfWaitingNode_eventNamesMissingCSINode_onlyThatNodesKeysRequeued(t *testing.T) {
	pvA, pvcA, _ := inTreeGCEClaim("disk-a")
	pvB, pvcB, handleB := inTreeGCEClaim("disk-b")
	w := newFakeWorld(t, Config{Workers: 2, MigrationByNode: []string{gcePDPlugin}},
		managedNode("node-a"), managedNode("node-b"), csiNode("node-a", nil),
		csiNode("node-b", map[string]string{v1.MigratedPluginsAnnotationKey: gcePDPlugin}),
		pvA, pvcA, pvB, pvcB, podUsing("app-a", "node-a", "disk-a"), podUsing("app-b", "node-b", "disk-b"))
	nameB := upstreamVAName(handleB, gcePDDriver, "node-b")
	if got := w.waitWrites(1); !slices.Equal(got, []string{"create volumeattachments " + nameB}) {
		t.Fatalf("writes = %q, want only the create on the migrated node-b", got)
	}
	w.eventually("FailedAttachVolume event", func() bool { return len(w.events.Events) > 0 })
	w.settle()
	if evs := w.recorded(); !slices.Equal(evs, []string{"Warning FailedAttachVolume " + decide.NotMigratedMessage("disk-a", gcePDPlugin, "node-a", true)}) {
		t.Fatalf("events = %q", evs)
	}

	// The keys a CSINode change enqueues are the gated volumes wanted on
	// that node only.
	enqueued := w.c.wake.migrationKeys("node-a")
	if len(enqueued) != 1 || enqueued[0].Node != "node-a" || !strings.Contains(string(enqueued[0].Volume), "disk-a") {
		t.Errorf("keys for a CSINode change of node-a = %v, want disk-a's on node-a", enqueued)
	}

	if err := w.tracker.Delete(csiNodeResource, "", "node-a"); err != nil {
		t.Fatal(err)
	}
	w.csiNodeSeen("node-a", false, "")
	w.eventually("second FailedAttachVolume event", func() bool { return len(w.events.Events) > 0 })
	if evs := w.recorded(); !slices.Equal(evs, []string{"Warning FailedAttachVolume " + decide.NotMigratedMessage("disk-a", gcePDPlugin, "node-a", false)}) {
		t.Fatalf("events after the CSINode is deleted = %q", evs)
	}
	w.noNewWrites(1, 100*time.Millisecond, "node-a has no CSINode")
}

func TestNew_migrationByNode_rejectsUnknownOrUntranslatedPlugins(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"CSI driver name", Config{MigrationByNode: []string{gcePDDriver}}, `unknown in-tree volume plugin "pd.csi.storage.gke.io"`},
		{"plugin not translated at all", Config{MigrationByNode: []string{gcePDPlugin}, MigratedPlugins: map[string]bool{"kubernetes.io/aws-ebs": true}},
			`in-tree plugin "kubernetes.io/gce-pd" is not translated to CSI at all`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			_, err := New(t.Context(), tc.cfg, client, informers.NewSharedInformerFactory(client, 0), record.NewFakeRecorder(1), nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New() error = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestTrimCSINode_keepsNameVersionAndAnnotation_idempotent(t *testing.T) {
	cn := csiNode("node-a", map[string]string{v1.MigratedPluginsAnnotationKey: gcePDPlugin, "kubectl.kubernetes.io/last-applied-configuration": "{}"})
	cn.ResourceVersion = "42"
	got, err := trimCSINode(cn)
	if err != nil {
		t.Fatal(err)
	}
	want := &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: "node-a", ResourceVersion: "42",
		Annotations: map[string]string{v1.MigratedPluginsAnnotationKey: gcePDPlugin}}}
	if !equalCSINodes(got, want) {
		t.Errorf("trimCSINode = %+v, want %+v", got, want)
	}
	again, _ := trimCSINode(got)
	if !equalCSINodes(again, want) {
		t.Errorf("trimCSINode twice = %+v, want %+v", again, want)
	}
	if len(cn.Spec.Drivers) != 1 || len(cn.Annotations) != 2 {
		t.Errorf("trimCSINode modified its input: %+v", cn)
	}
	bare, _ := trimCSINode(csiNode("node-b", nil))
	if a := bare.(*storagev1.CSINode).Annotations; a != nil {
		t.Errorf("annotations of a CSINode without the key = %v, want nil", a)
	}
	tomb := cache.DeletedFinalStateUnknown{Key: "node-a", Obj: want}
	if got, _ := trimCSINode(tomb); got != any(tomb) {
		t.Errorf("tombstone changed: %+v", got)
	}
}

func equalCSINodes(got any, want *storagev1.CSINode) bool {
	cn, ok := got.(*storagev1.CSINode)
	return ok && cn.Name == want.Name && cn.ResourceVersion == want.ResourceVersion && maps.Equal(cn.Annotations, want.Annotations) &&
		cn.UID == "" && cn.ManagedFields == nil && len(cn.Spec.Drivers) == 0
}
