package attachdetach_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/latchcsi/latch/internal/attachdetach/controller"
	"github.com/latchcsi/latch/internal/attachdetach/decide"
	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// Per-node CSI migration (--csi-migration-by-node) of in-tree GCE PD
// volumes, which csi-translation-lib hands to pd.csi.storage.gke.io. The
// tests run the trivial csi-attacher under that driver name.
//
// The kubelet stand-in translates migrated in-tree PVs as a kubelet with
// CSI migration does, so it starts the Pod only once the node status lists
// the translated volume as attached.

const (
	gcePDPlugin = "kubernetes.io/gce-pd"
	gcePDDriver = "pd.csi.storage.gke.io"
	gcePDZone   = "us-central1-a"
)

// newGCEPDEnv is newEnv with the test's driver being GCE PD's CSI driver.
func newGCEPDEnv(t *testing.T, cfg controller.Config) *env {
	t.Helper()
	return newEnvWith(t, envOptions{cfg: cfg, driver: gcePDDriver})
}

// inTreeGCEPDVolume creates an in-tree GCE PD PV (disk = PV name) bound to
// a PVC of the same name, and returns the name and the CSI volume handle
// csi-translation-lib gives it.
func (e *env) inTreeGCEPDVolume(suffix string) (name, handle string) {
	e.t.Helper()
	name = e.prefix + "-" + suffix
	size := v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")}
	modes := []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}
	pvc, err := e.client.CoreV1().PersistentVolumeClaims(e.ns).Create(e.ctx, &v1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: name},
		Spec: v1.PersistentVolumeClaimSpec{AccessModes: modes, Resources: v1.VolumeResourceRequirements{Requests: size},
			VolumeName: name, StorageClassName: new(string)},
	}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	pv, err := e.client.CoreV1().PersistentVolumes().Create(e.ctx, &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1.LabelTopologyZone: gcePDZone}},
		Spec: v1.PersistentVolumeSpec{
			AccessModes: modes, Capacity: size, PersistentVolumeReclaimPolicy: v1.PersistentVolumeReclaimRetain,
			ClaimRef:               &v1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: e.ns, Name: name, UID: pvc.UID},
			PersistentVolumeSource: v1.PersistentVolumeSource{GCEPersistentDisk: &v1.GCEPersistentDiskVolumeSource{PDName: name, FSType: "ext4"}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	pv.Status.Phase = v1.VolumeBound
	if _, err := e.client.CoreV1().PersistentVolumes().UpdateStatus(e.ctx, pv, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	pvc.Status = v1.PersistentVolumeClaimStatus{Phase: v1.ClaimBound, AccessModes: modes, Capacity: size}
	if _, err := e.client.CoreV1().PersistentVolumeClaims(e.ns).UpdateStatus(e.ctx, pvc, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	return name, "projects/UNSPECIFIED/zones/" + gcePDZone + "/disks/" + name
}

// setMigratedPlugins sets (or, with remove, deletes) the migrated-plugins
// annotation of the node's CSINode, as a kubelet does.
func (e *env) setMigratedPlugins(node, value string, remove bool) {
	e.t.Helper()
	var v any = value
	if remove {
		v = nil
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{v1.MigratedPluginsAnnotationKey: v}}})
	if _, err := e.client.StorageV1().CSINodes().Patch(e.ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// waitingGauge returns the controller's waiting gauge for GCE PD as
// gathered from its registry (a missing series reads as 0).
func (e *env) waitingGauge() float64 {
	families, err := e.registry.Gather()
	if err != nil {
		e.t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != controller.WaitingForMigrationMetric {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "plugin" && l.GetValue() == gcePDPlugin {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return 0
}

// waitAttachedVAByName waits until the VolumeAttachment name exists and is
// attached.
func (e *env) waitAttachedVAByName(name string) *storagev1.VolumeAttachment {
	e.t.Helper()
	var va *storagev1.VolumeAttachment
	e.eventually("VolumeAttachment "+name+" attached", func() (bool, error) {
		v, ok := e.getVA(name)
		va = v
		return ok && v.Status.Attached, nil
	})
	return va
}

func TestMigrationByNode_podWaitsWithWarningUntilCSINodeListsPlugin_thenAttachesAndRuns(t *testing.T) {
	e := newGCEPDEnv(t, controller.Config{Workers: 4, MigrationByNode: []string{gcePDPlugin}})
	node := e.addNode("n1") // its CSINode has no migrated-plugins annotation
	pv, handle := e.inTreeGCEPDVolume("disk")
	vaName := kubenames.VolumeAttachmentName(handle, gcePDDriver, node)
	unique := kubenames.UniqueVolumeName(gcePDDriver, handle)
	e.pod("app", node, pv)

	// The node has not migrated GCE PD: one Warning that names the volume,
	// the plugin, the node and the annotation, and no VolumeAttachment.
	notMigrated := fmt.Sprintf("AttachVolume.Attach failed for volume %q : in-tree plugin %s is not migrated to CSI on node %s: "+
		"CSINode %s does not list the plugin in its annotation %s; waiting for the node to migrate it", pv, gcePDPlugin, node, node, v1.MigratedPluginsAnnotationKey)
	if got := decide.NotMigratedMessage(pv, gcePDPlugin, node, true); got != notMigrated {
		t.Fatalf("NotMigratedMessage = %q, want %q", got, notMigrated)
	}
	e.waitEvent("app", "FailedAttachVolume", notMigrated)
	e.eventually(controller.WaitingForMigrationMetric+" = 1", func() (bool, error) { return e.waitingGauge() == 1, nil })
	e.consistently("no VolumeAttachment and the Pod not running while the node has not migrated the plugin", time.Second, func() (bool, error) {
		_, exists := e.getVA(vaName)
		p, err := e.client.CoreV1().Pods(e.ns).Get(e.ctx, "app", metav1.GetOptions{})
		return !exists && e.createCount() == 0 && err == nil && p.Status.Phase != v1.PodRunning, err
	})
	if got := e.controllerWrites(); len(got) != 0 {
		t.Fatalf("controller API writes while waiting = %q, want none", got)
	}

	// The kubelet migrates the plugin: attach, node status, Pod running.
	e.setMigratedPlugins(node, "kubernetes.io/aws-ebs,"+gcePDPlugin, false)
	va := e.waitAttachedVAByName(vaName)
	if va.Spec.Attacher != gcePDDriver || va.Spec.NodeName != node || va.Spec.Source.PersistentVolumeName == nil || *va.Spec.Source.PersistentVolumeName != pv {
		t.Errorf("VolumeAttachment spec = %+v", va.Spec)
	}
	e.waitNodeAttached(node, unique)
	e.waitPodRunning("app")
	e.waitEvent("app", "SuccessfulAttachVolume", fmt.Sprintf("AttachVolume.Attach succeeded for volume %q ", pv))
	if evs := e.events("app", "FailedAttachVolume"); len(evs) != 1 || evs[0].Type != v1.EventTypeWarning || evs[0].Count > 1 {
		t.Errorf("FailedAttachVolume events = %+v, want exactly one Warning, emitted once", evs)
	}
	if got := e.createCount(); got != 1 {
		t.Errorf("VolumeAttachment creates = %d, want 1", got)
	}
	e.eventually(controller.WaitingForMigrationMetric+" = 0", func() (bool, error) { return e.waitingGauge() == 0, nil })

	// The node stops listing the plugin: the attachment stays.
	e.setMigratedPlugins(node, "", true)
	e.consistently("attachment kept after the annotation is removed", time.Second, func() (bool, error) {
		v, ok := e.getVA(vaName)
		return ok && v.Status.Attached && v.DeletionTimestamp == nil, nil
	})
	e.waitNodeAttached(node, unique)
	vaPath := "/apis/storage.k8s.io/v1/volumeattachments"
	wantWrites := []string{"POST " + vaPath, "PATCH /api/v1/nodes/" + node + "/status"}
	e.eventually(fmt.Sprintf("controller API writes %q", wantWrites), func() (bool, error) {
		got := e.controllerWrites()
		if len(got) > len(wantWrites) || !slices.Equal(got, wantWrites[:len(got)]) {
			return false, fmt.Errorf("controller API writes:\n got %q\nwant %q", got, wantWrites)
		}
		return len(got) == len(wantWrites), nil
	})
	if evs := e.events("app", "FailedAttachVolume"); len(evs) != 1 {
		t.Errorf("FailedAttachVolume events after the annotation went = %d, want still 1", len(evs))
	}
}

func TestMigrationByNode_off_sameInTreePodAttachesAtOnce(t *testing.T) {
	e := newGCEPDEnv(t, controller.Config{Workers: 4})
	node := e.addNode("n1") // no migrated-plugins annotation either
	pv, handle := e.inTreeGCEPDVolume("disk")
	e.pod("app", node, pv)

	va := e.waitAttachedVAByName(kubenames.VolumeAttachmentName(handle, gcePDDriver, node))
	if va.Spec.Attacher != gcePDDriver || va.Spec.Source.PersistentVolumeName == nil || *va.Spec.Source.PersistentVolumeName != pv {
		t.Errorf("VolumeAttachment spec = %+v", va.Spec)
	}
	e.waitNodeAttached(node, kubenames.UniqueVolumeName(gcePDDriver, handle))
	e.waitPodRunning("app")
	e.waitEvent("app", "SuccessfulAttachVolume", fmt.Sprintf("AttachVolume.Attach succeeded for volume %q ", pv))
	if evs := e.events("app", "FailedAttachVolume"); len(evs) != 0 {
		t.Errorf("FailedAttachVolume events = %+v, want none", evs)
	}
	if got := e.createCount(); got != 1 {
		t.Errorf("VolumeAttachment creates = %d, want 1", got)
	}
}
