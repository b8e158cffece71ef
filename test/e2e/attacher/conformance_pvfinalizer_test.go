package attacher_test

import (
	"slices"
	"testing"
	"time"

	"github.com/latchcsi/latch/internal/kube/kubenames"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// annMigratedTo is the annotation kube-controller-manager's PV controller
// puts on an in-tree PV while CSI migration is on for its plugin.
const annMigratedTo = "pv.kubernetes.io/migrated-to"

// upstream: TestProcessFinalizers (the migrated-PV cases) and
// SyncNewOrUpdatedPersistentVolume. After a CSI migration rollback the
// in-tree PV loses its migrated-to annotation; our finalizer on it is
// removed once no VolumeAttachment refers to it, without waiting for the
// PV to be deleted (so that uninstalling the driver later cannot leave
// the PV undeletable). While the annotation names our driver, or a VA
// refers to the PV, the finalizer stays.
func TestMigrationRollbackRemovesOurFinalizerFromInTreePVNoVolumeAttachmentNeeds(t *testing.T) {
	const gcePD = "pd.csi.storage.gke.io"
	e := newEnv(t, envOptions{driverName: gcePD})
	inTree := func(name string, ann map[string]string) {
		t.Helper()
		pv := &v1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{
				Name: name, Annotations: ann,
				Labels:     map[string]string{v1.LabelTopologyZone: "europe-west1-b"},
				Finalizers: []string{kubenames.PVFinalizer(gcePD), "example.com/other"},
			},
			Spec: v1.PersistentVolumeSpec{
				AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
				Capacity:    v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")},
				PersistentVolumeSource: v1.PersistentVolumeSource{GCEPersistentDisk: &v1.GCEPersistentDiskVolumeSource{
					PDName: name + "-disk",
				}},
			},
		}
		if _, err := e.client.CoreV1().PersistentVolumes().Create(e.ctx, pv, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	finalizers := func(name string) []string {
		t.Helper()
		pv, err := e.client.CoreV1().PersistentVolumes().Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return pv.Finalizers
	}
	rolledBack, migrated, inUse := e.prefix+"-rolledback", e.prefix+"-migrated", e.prefix+"-inuse"
	inTree(rolledBack, map[string]string{"random": "random"})
	inTree(migrated, map[string]string{annMigratedTo: gcePD})
	inTree(inUse, nil)
	e.createVA(e.newVA(e.prefix+"-va", inUse, e.node))
	e.waitAttached(e.prefix+"-va", time.Minute)

	e.eventually(30*time.Second, "our finalizer removed from the rolled-back PV", func() (bool, error) {
		return !slices.Contains(finalizers(rolledBack), kubenames.PVFinalizer(gcePD)), nil
	})
	if got := finalizers(rolledBack); !slices.Contains(got, "example.com/other") {
		t.Errorf("rolled-back PV finalizers = %v, want the other finalizer kept", got)
	}
	time.Sleep(500 * time.Millisecond) // a wrong removal would show by now
	if got := finalizers(migrated); !slices.Contains(got, kubenames.PVFinalizer(gcePD)) {
		t.Errorf("PV annotated migrated-to %s lost our finalizer: %v", gcePD, got)
	}
	if got := finalizers(inUse); !slices.Contains(got, kubenames.PVFinalizer(gcePD)) {
		t.Errorf("PV a VolumeAttachment refers to lost our finalizer: %v", got)
	}
	// Once its VA is gone, the PV in use goes the same way.
	e.deleteVA(e.prefix + "-va")
	e.waitGone(e.prefix + "-va")
	e.eventually(30*time.Second, "our finalizer removed once the VA is gone", func() (bool, error) {
		return !slices.Contains(finalizers(inUse), kubenames.PVFinalizer(gcePD)), nil
	})
}
