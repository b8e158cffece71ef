package attacher

import (
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	v1 "k8s.io/api/core/v1"

	"github.com/latchcsi/latch/internal/csi"
	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// A VolumeAttachment attached by upstream's external-attacher before the
// swap (our finalizer and the node-id annotation, no latch volume-handle
// annotation) whose PV is already being deleted. The PV object is still
// there in full (our PV finalizer keeps it): the detach uses its spec, as
// upstream's does (only an attach refuses a deleting PV), and unpublishes
// the volume.
func TestDetachOfUpstreamAttachedVAWhosePVIsDeletingUnpublishesWithThePVsHandle(t *testing.T) {
	pv := deleting(execPV("pv-a"))
	pv.Finalizers = []string{kubenames.PVFinalizer(execDriver), "kubernetes.io/pv-protection"}
	va := attachedVA("va-a", "pv-a")
	delete(va.Annotations, AnnVolumeHandle) // attached by upstream
	va = deleting(va)
	f := newExecFixture(t, pv, va, execCSINode())
	capability := publishCapability(t)
	if _, err := f.driver.SeedPublication("handle-pv-a", "node-1-id", false, capability); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		_, _ = f.ctrl.syncDetach(f.ctx, "va-a")
	}
	if got := f.driver.Published("handle-pv-a"); len(got) != 0 {
		t.Errorf("volume still published to %v; CSI calls %q; detachError %v", got, f.csiCalls(), f.va("va-a").Status.DetachError)
	}
}

// publishCapability is the capability execPV's volume is published with.
func publishCapability(t *testing.T) *csipb.VolumeCapability {
	t.Helper()
	c, err := csi.VolumeCapability(csi.CapabilityInput{AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}, FSType: "ext4"})
	if err != nil {
		t.Fatal(err)
	}
	return c
}
