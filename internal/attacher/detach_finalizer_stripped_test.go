package attacher

import (
	"slices"
	"testing"

	"google.golang.org/grpc/codes"

	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clienttesting "k8s.io/client-go/testing"

	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// While ControllerPublish is in flight the VolumeAttachment is deleted and
// our finalizer is stripped by another client, but another finalizer keeps
// the object. The status write (UID unchanged) succeeds, so no orphan is
// made; the VA is deleting, marked attached, with the volume handle and
// node ID latch recorded: the detach pass unpublishes it
// (decide.Detach), also for a driver without LIST_VOLUMES_PUBLISHED_NODES,
// where no ListVolumes reconcile would.
func TestPublishForVAWhoseFinalizerIsStrippedWhileAnotherKeepsItIsUnpublished(t *testing.T) {
	va := execVA("va-a", "pv-a")
	va.Finalizers = []string{"example.com/keep"}
	f := newExecFixture(t, execPV("pv-a"), va, execCSINode())
	stripOurFinalizerAtFirstStatusWrite(f, "va-a")
	_, _ = f.ctrl.syncAttach(f.ctx, "va-a")
	f.waitFor("deleting VA in the cache", func() bool {
		cached, _ := LookupVA(f.vaStore, "va-a")
		return cached != nil && cached.DeletionTimestamp != nil
	})
	for range 3 {
		_, _ = f.ctrl.syncAttach(f.ctx, "va-a")
		_, _ = f.ctrl.syncDetach(f.ctx, "va-a")
	}
	got := f.va("va-a")
	if pub := f.driver.Published("handle-pv-a"); len(pub) != 0 {
		t.Errorf("volume published to %v for a deleting VA without our finalizer (finalizers %v, attached=%v); no detach will come; orphans %v; CSI calls %q",
			pub, got.Finalizers, got.Status.Attached, f.ctrl.orphanSnapshot(), f.csiCalls())
	}
}

// The same with a publish of unknown outcome (Unavailable): the attachError
// write lands on the deleting VA whose finalizer was stripped, so the
// object it returns shows that no detach of ours will come. The possible
// publication is an orphan, unpublished at once.
func TestPublishOfUnknownOutcomeForVAWhoseFinalizerIsStrippedIsUnpublished(t *testing.T) {
	va := execVA("va-a", "pv-a")
	va.Finalizers = []string{"example.com/keep"}
	f := newExecFixture(t, execPV("pv-a"), va, execCSINode())
	store := withStore(f)
	if _, err := f.driver.AddFault(csimock.Rule{Method: "ControllerPublishVolume", Once: true, Phase: csimock.PhaseAfter, Code: codes.Unavailable, Message: "backend busy"}); err != nil {
		t.Fatal(err)
	}
	stripOurFinalizerAtFirstStatusWrite(f, "va-a")
	if _, err := f.ctrl.syncAttach(f.ctx, "va-a"); err != nil {
		t.Fatalf("syncAttach: %v, want the possible publication unpublished", err)
	}
	f.requireCSICalls(
		"ControllerPublishVolume handle-pv-a node-1-id Unavailable",
		"ControllerUnpublishVolume handle-pv-a node-1-id OK")
	if got := store.operations(); !slices.Equal(got, []string{"put va-a", "delete va-a"}) {
		t.Errorf("record operations = %v, want [put va-a delete va-a]", got)
	}
	if pub := f.driver.Published("handle-pv-a"); len(pub) != 0 {
		t.Errorf("volume still published to %v", pub)
	}
}

// stripOurFinalizerAtFirstStatusWrite makes another client delete the VA
// name and strip our finalizer from it (another finalizer keeps it) just
// before csi-attacher's first status write to it, which then goes on.
func stripOurFinalizerAtFirstStatusWrite(f *execFixture, name string) {
	done := false
	f.client.PrependReactor("patch", "volumeattachments", func(action clienttesting.Action) (bool, runtime.Object, error) {
		if action.GetSubresource() != "status" || done {
			return false, nil, nil
		}
		done = true
		obj, err := f.tracker.Get(vaGVR, "", name)
		if err != nil {
			return true, nil, err
		}
		cur := obj.(*storagev1.VolumeAttachment).DeepCopy()
		now := metav1.Now()
		cur.DeletionTimestamp = &now
		cur.Finalizers = slices.DeleteFunc(cur.Finalizers, func(s string) bool { return s == kubenames.AttacherFinalizer(execDriver) })
		if err := f.tracker.Update(vaGVR, cur, ""); err != nil {
			return true, nil, err
		}
		return false, nil, nil // the status patch itself goes on
	})
}
