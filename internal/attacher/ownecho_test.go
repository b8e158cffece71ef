package attacher

import (
	"strings"
	"sync"
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

// echoFirst makes the fixture's API server answer every VolumeAttachment
// patch only after the controller's event handler has handled the version
// the patch made: the informer delivers each of our writes before its
// call returns, deterministically. It records how the handler took each.
type echoFirst struct {
	seen   chan echo
	mu     sync.Mutex
	echoes []echo
}

func newEchoFirst() *echoFirst { return &echoFirst{seen: make(chan echo, 64)} }

// setup is the fixture hook that reports the handler's verdicts.
func (e *echoFirst) setup(c *Controller) {
	c.vaEchoSeen = func(va *storagev1.VolumeAttachment, own bool) { e.seen <- echo{va.ResourceVersion, own} }
}

// install puts the reactor in front of the fixture's API server.
func (e *echoFirst) install(t *testing.T, f *execFixture) {
	f.client.PrependReactor("patch", "volumeattachments", func(action clienttesting.Action) (bool, runtime.Object, error) {
		handled, obj, err := clienttesting.ObjectReaction(f.tracker)(action)
		if err != nil {
			return handled, obj, err
		}
		rv := obj.(*storagev1.VolumeAttachment).ResourceVersion
		timeout := time.After(10 * time.Second)
		for {
			select {
			case got := <-e.seen:
				if got.rv != rv {
					continue
				}
				e.mu.Lock()
				e.echoes = append(e.echoes, got)
				e.mu.Unlock()
				return handled, obj, err
			case <-timeout:
				t.Errorf("the informer did not deliver resourceVersion %s", rv)
				return handled, obj, err
			}
		}
	})
}

// recorded returns the echoes of our writes so far.
func (e *echoFirst) recorded() []echo {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]echo(nil), e.echoes...)
}

// A failed attach writes our finalizer and node ID, then status.attachError.
// Here the informer delivers each of those VolumeAttachment writes before
// its Patch call returns (echoFirst). Both echoes must be recognised as
// ours (the handler routes every update it does not recognise to a pass),
// so the driver sees one ControllerPublish until the retry interval
// (upstream external-attacher #337: a second one at once). The order is
// forced every run; the scenario runs many times for the handler's
// interleavings with the rest of the pass.
func TestOwnWritesEchoedBeforeThePatchReturnsAreRecognisedAndStartNoPass(t *testing.T) {
	for range 20 {
		ownWritesEchoedBeforeThePatchReturns(t)
	}
}

func ownWritesEchoedBeforeThePatchReturns(t *testing.T) {
	t.Helper()
	ef := newEchoFirst()
	f := newExecFixtureWith(t, fixtureHooks{setup: ef.setup}, execPV("pv-e"), execVA("va-e", "pv-e"), execCSINode())
	if _, err := f.driver.AddFault(csimock.Rule{Method: "ControllerPublishVolume", Code: codes.Internal, Message: "array offline"}); err != nil {
		t.Fatal(err)
	}
	ef.install(t, f)

	if _, err := f.ctrl.syncAttach(f.ctx, "va-e"); err == nil || !strings.Contains(err.Error(), "array offline") {
		t.Fatalf("syncAttach error = %v, want the driver's error", err)
	}
	f.requireWrites(
		"patch persistentvolumes pv-e",
		"patch volumeattachments va-e",
		"patch volumeattachments/status va-e",
	)
	if echoes := ef.recorded(); len(echoes) != 2 || !echoes[0].own || !echoes[1].own {
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
