package attacher

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/latchcsi/latch/internal/csi"
)

// slowBackendCSI models a conforming driver whose backend takes longer
// than the attacher's --timeout to publish (a cloud disk attach): the
// first ControllerPublish answers DeadlineExceeded to the caller while the
// backend goes on and publishes once land is closed; while that publish is
// pending, ControllerUnpublish of the same volume answers Aborted (the CSI
// spec's "an operation is pending for this volume"), and ListVolumes shows
// what is published now (not the pending publish).
type slowBackendCSI struct {
	CSIClient
	land    chan struct{}
	mu      sync.Mutex
	pending bool
	landed  chan struct{}
	started bool
}

func (s *slowBackendCSI) ControllerPublish(ctx context.Context, req csi.PublishRequest) (map[string]string, error) {
	s.mu.Lock()
	first := !s.started
	s.started = true
	if first {
		s.pending = true
	}
	s.mu.Unlock()
	if !first {
		return s.CSIClient.ControllerPublish(ctx, req)
	}
	go func() {
		<-s.land
		_, _ = s.CSIClient.ControllerPublish(context.Background(), req)
		s.mu.Lock()
		s.pending = false
		s.mu.Unlock()
		close(s.landed)
	}()
	<-ctx.Done()
	return nil, status.Error(codes.DeadlineExceeded, "context deadline exceeded")
}

func (s *slowBackendCSI) ControllerUnpublish(ctx context.Context, volumeID, nodeID string, secrets map[string]string) error {
	s.mu.Lock()
	pending := s.pending
	s.mu.Unlock()
	if pending {
		return status.Error(codes.Aborted, "an operation is pending for volume "+volumeID)
	}
	return s.CSIClient.ControllerUnpublish(ctx, volumeID, nodeID, secrets)
}

// A publish of unknown outcome (DeadlineExceeded: the backend is still
// attaching) for a VolumeAttachment that is force-deleted meanwhile is an
// orphan; its unpublish is refused with Aborted while the publish is
// pending. The ListVolumes reconcile, run while the publish is still
// pending, does not list the volume on the node, yet keeps the orphan
// (decide.ForgetUnlisted: its publish may still land). Once the publish
// lands, the orphan's retry unpublishes it.
func TestOrphanOfPublishStillUnderWayIsNotForgottenByListVolumesAndIsUnpublishedOnceItLands(t *testing.T) {
	f := newExecFixture(t, execPV("pv-a"), execVA("va-a", "pv-a"), execCSINode())
	store := withStore(f)
	slow := &slowBackendCSI{CSIClient: f.ctrl.exec.csi, land: make(chan struct{}), landed: make(chan struct{})}
	f.ctrl.exec.csi = slow
	f.ctrl.exec.timeout = 200 * time.Millisecond
	deleteOnStatusPatch(f, "va-a")

	if _, err := f.ctrl.syncAttach(f.ctx, "va-a"); err == nil {
		t.Fatal("syncAttach succeeded, want the Aborted orphan unpublish")
	}
	if _, ok := f.ctrl.orphanSnapshot()["va-a"]; !ok {
		t.Fatalf("no orphan after a publish of unknown outcome for a deleted VA: %v", f.ctrl.orphanSnapshot())
	}
	// The periodic ListVolumes reconcile runs while the backend still
	// attaches.
	if err := f.ctrl.reconcileOnce(f.ctx); err != nil {
		t.Fatalf("reconcileOnce: %v", err)
	}
	// The backend finishes the attach.
	close(slow.land)
	<-slow.landed
	f.waitFor("VA gone from the cache", func() bool { _, exists, _ := f.vaStore.GetByKey("va-a"); return !exists })
	// The orphan key's retries.
	for range 3 {
		_, _ = f.ctrl.syncAttach(f.ctx, "va-a")
	}
	if got := f.driver.Published("handle-pv-a"); len(got) != 0 {
		t.Errorf("volume handle-pv-a published to %v with no VolumeAttachment and no orphan left (orphans %v, record ops %v)",
			got, f.ctrl.orphanSnapshot(), store.operations())
	}
}
