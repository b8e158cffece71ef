package attacher

import (
	"errors"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	clienttesting "k8s.io/client-go/testing"
)

// The publish succeeds; the VolumeAttachment is force-deleted meanwhile
// (our finalizer stripped by another client, the case the orphan machinery
// exists for), and the status write that would have told us so fails for
// another reason (an API server timeout / 500). The publication is
// remembered as a suspect; the retry, which finds no VolumeAttachment in
// the cache, reads it live, finds it gone and unpublishes the volume.
func TestPublishForForceDeletedVAWhoseStatusWriteFailsTransientlyIsUnpublished(t *testing.T) {
	f := newExecFixture(t, execPV("pv-a"), execVA("va-a", "pv-a"), execCSINode())
	done := false
	f.client.PrependReactor("patch", "volumeattachments", func(action clienttesting.Action) (bool, runtime.Object, error) {
		if action.GetSubresource() != "status" || done {
			return false, nil, nil
		}
		done = true
		if err := f.tracker.Delete(vaGVR, "", "va-a"); err != nil {
			return true, nil, err
		}
		return true, nil, apierrors.NewInternalError(errors.New("etcdserver: request timed out"))
	})
	if _, err := f.ctrl.syncAttach(f.ctx, "va-a"); err == nil {
		t.Fatal("syncAttach succeeded, want the failed status write")
	}
	f.waitFor("VA gone from the cache", func() bool { _, exists, _ := f.vaStore.GetByKey("va-a"); return !exists })
	// The runner's retries of the key.
	for range 3 {
		_, _ = f.ctrl.syncAttach(f.ctx, "va-a")
		_, _ = f.ctrl.syncDetach(f.ctx, "va-a")
	}
	if got := f.driver.Published("handle-pv-a"); len(got) != 0 {
		t.Errorf("volume published to %v with its VolumeAttachment gone and no orphan (orphans %v); CSI calls %q",
			got, f.ctrl.orphanSnapshot(), f.csiCalls())
	}
}
