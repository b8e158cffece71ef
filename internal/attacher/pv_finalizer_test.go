package attacher

import (
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clienttesting "k8s.io/client-go/testing"

	"github.com/latchcsi/latch/internal/kube/kubenames"
)

func TestExecutorDeletingPVLosesFinalizerOnlyWhenNoVAReferencesIt(t *testing.T) {
	pv := deleting(execPV("pv-p"))
	pv.Finalizers = []string{"kubernetes.io/pv-protection", kubenames.PVFinalizer(execDriver)}
	f := newExecFixture(t, pv, attachedVA("va-p", "pv-p"), execCSINode())

	// A VA still refers to the PV: nothing is written.
	if _, err := f.ctrl.syncPV(f.ctx, "pv-p"); err != nil {
		t.Fatalf("syncPV: %v", err)
	}
	f.requireWrites()

	// The VA is gone (deleted outright in the tracker): the finalizer goes,
	// guarded by the PV's finalizer list, other finalizers untouched.
	if err := f.tracker.Delete(vaGVR, "", "va-p"); err != nil {
		t.Fatal(err)
	}
	f.waitFor("VA gone from the cache", func() bool {
		_, exists, err := f.vaStore.GetByKey("va-p")
		return err == nil && !exists
	})
	if _, err := f.ctrl.syncPV(f.ctx, "pv-p"); err != nil {
		t.Fatalf("syncPV: %v", err)
	}
	w := f.requireWrites("patch persistentvolumes pv-p")
	requirePatch(t, w[0], types.JSONPatchType, `[
		{"op":"test","path":"/metadata/finalizers","value":["kubernetes.io/pv-protection","`+kubenames.PVFinalizer(execDriver)+`"]},
		{"op":"replace","path":"/metadata/finalizers","value":["kubernetes.io/pv-protection"]}]`)
	f.requireCSICalls()
	if got := f.pv("pv-p").Finalizers; !slices.Equal(got, []string{"kubernetes.io/pv-protection"}) {
		t.Errorf("PV finalizers = %v", got)
	}
}

func TestExecutorPVNotDeletingKeepsFinalizer(t *testing.T) {
	pv := execPV("pv-p")
	pv.Finalizers = []string{kubenames.PVFinalizer(execDriver)}
	f := newExecFixture(t, pv, execCSINode())
	if _, err := f.ctrl.syncPV(f.ctx, "pv-p"); err != nil {
		t.Fatalf("syncPV: %v", err)
	}
	f.requireWrites()
}

// What we remember of our own write to a PV goes with the PV: a cluster
// that keeps deleting PVs does not keep one entry per PV it ever released.
// As on a real API server, removing the last finalizer deletes the PV and
// the answer carries the resourceVersion it had, so no later version of
// it ever reaches the informer: only its deletion can drop the entry.
func TestExecutorDeletedPVLeavesNoOwnWriteEntryBehind(t *testing.T) {
	pv := deleting(execPV("pv-p"))
	pv.Finalizers = []string{kubenames.PVFinalizer(execDriver)}
	f := newExecFixture(t, pv, execCSINode())
	f.client.PrependReactor("patch", "persistentvolumes", func(clienttesting.Action) (bool, runtime.Object, error) {
		obj, err := f.tracker.Get(pvGVR, "", "pv-p")
		if err != nil {
			return true, nil, err
		}
		gone := obj.(*v1.PersistentVolume).DeepCopy()
		gone.Finalizers = nil
		return true, gone, f.tracker.Delete(pvGVR, "", "pv-p")
	})
	entries := f.ctrl.pvCache.Len
	if _, err := f.ctrl.syncPV(f.ctx, "pv-p"); err != nil {
		t.Fatalf("syncPV: %v", err)
	}
	f.requireWrites("patch persistentvolumes pv-p")
	f.waitFor("the PV gone from the cache", func() bool {
		_, exists, err := f.pvStore.GetByKey("pv-p")
		return err == nil && !exists
	})
	f.waitFor("the PV's own-write entry dropped with the PV", func() bool { return entries() == 0 })
}
