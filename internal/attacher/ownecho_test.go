package attacher

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clienttesting "k8s.io/client-go/testing"

	"github.com/latchcsi/latch/internal/csimock"
)

type echo struct {
	rv  string
	own bool
}

// A failed attach writes our finalizer and node ID, then status.attachError.
// Here the informer delivers each of those VolumeAttachment writes before
// its Patch call returns: the reactor applies the patch, waits until the
// controller's event handler has handled the new version, and only then
// answers. Both echoes must be recognised as ours (the handler routes
// every update it does not recognise to a pass), so the driver sees one
// ControllerPublish until the retry interval (upstream external-attacher
// #337: a second one at once). The order is
// forced every run; the scenario runs many times for the handler's
// interleavings with the rest of the pass.
func TestOwnWritesEchoedBeforeThePatchReturnsAreRecognisedAndStartNoPass(t *testing.T) {
	for range 20 {
		ownWritesEchoedBeforeThePatchReturns(t)
	}
}

func ownWritesEchoedBeforeThePatchReturns(t *testing.T) {
	t.Helper()
	seen := make(chan echo, 64)
	f := newExecFixtureWith(t, func(c *Controller) {
		c.vaEchoSeen = func(va *storagev1.VolumeAttachment, own bool) { seen <- echo{va.ResourceVersion, own} }
	}, execPV("pv-e"), execVA("va-e", "pv-e"), execCSINode())
	if _, err := f.driver.AddFault(csimock.Rule{Method: "ControllerPublishVolume", Code: codes.Internal, Message: "array offline"}); err != nil {
		t.Fatal(err)
	}
	var echoes []echo
	f.client.PrependReactor("patch", "volumeattachments", func(action clienttesting.Action) (bool, runtime.Object, error) {
		handled, obj, err := clienttesting.ObjectReaction(f.tracker)(action)
		if err != nil {
			return handled, obj, err
		}
		rv := obj.(*storagev1.VolumeAttachment).ResourceVersion
		timeout := time.After(10 * time.Second)
		for {
			select {
			case e := <-seen:
				if e.rv != rv {
					continue
				}
				echoes = append(echoes, e)
				return handled, obj, err
			case <-timeout:
				t.Errorf("the informer did not deliver resourceVersion %s", rv)
				return handled, obj, err
			}
		}
	})

	if _, err := f.ctrl.syncAttach(f.ctx, "va-e"); err == nil || !strings.Contains(err.Error(), "array offline") {
		t.Fatalf("syncAttach error = %v, want the driver's error", err)
	}
	f.requireWrites(
		"patch persistentvolumes pv-e",
		"patch volumeattachments va-e",
		"patch volumeattachments/status va-e",
	)
	if len(echoes) != 2 || !echoes[0].own || !echoes[1].own {
		t.Fatalf("echoes of our two VolumeAttachment writes = %+v, want both recognised as ours", echoes)
	}
	if got := f.va("va-e").Status.AttachError; got == nil || !strings.Contains(got.Message, "array offline") {
		t.Fatalf("attachError = %+v, want the driver's error", got)
	}
	f.requireCSICalls("ControllerPublishVolume handle-pv-e node-1-id Internal")
	if n := f.ctrl.vaCache.Len(); n != 0 {
		t.Errorf("overlay entries after the echoes = %d, want none", n)
	}
}
