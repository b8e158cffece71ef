package attacher

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clienttesting "k8s.io/client-go/testing"

	"github.com/latchcsi/latch/internal/csi"
	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// memOrphanStore is an orphanStore in memory that logs its operations.
type memOrphanStore struct {
	mu   sync.Mutex
	recs map[string]orphanRecord
	ops  []string
	// onPut runs before a Put is stored.
	onPut func(orphanRecord)
}

var _ orphanStore = (*memOrphanStore)(nil)

func (s *memOrphanStore) Load(context.Context) (map[string]orphanRecord, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]orphanRecord{}
	for k, v := range s.recs {
		out[k] = v
	}
	return out, nil
}

func (s *memOrphanStore) Put(_ context.Context, rec orphanRecord) error {
	if s.onPut != nil {
		s.onPut(rec)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.recs[rec.VolumeAttachment] = rec
	s.ops = append(s.ops, "put "+rec.VolumeAttachment)
	return nil
}

func (s *memOrphanStore) Delete(_ context.Context, rec orphanRecord) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur, ok := s.recs[rec.VolumeAttachment]; ok && sameRecord(cur, rec) {
		delete(s.recs, rec.VolumeAttachment)
	}
	s.ops = append(s.ops, "delete "+rec.VolumeAttachment)
	return nil
}

func (s *memOrphanStore) operations() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.ops)
}

func withStore(f *execFixture) *memOrphanStore {
	s := &memOrphanStore{recs: map[string]orphanRecord{}}
	f.ctrl.exec.records = s
	return s
}

// The publication of a VolumeAttachment deleted during its publish is
// written to the record before the unpublish is tried, stays there while
// the unpublish fails, and is removed once it succeeded; the record holds
// the secret reference, never the values.
func TestOrphanRecordedBeforeUnpublishAndRemovedAfter(t *testing.T) {
	pv := execPV("pv-a")
	pv.Spec.CSI.ControllerPublishSecretRef = &v1.SecretReference{Namespace: "ns", Name: "s"}
	secret := &v1.Secret{}
	secret.Namespace, secret.Name = "ns", "s"
	secret.Data = map[string][]byte{"password": []byte("hunter2")}
	f := newExecFixture(t, pv, execVA("va-a", "pv-a"), execCSINode(), secret)
	store := withStore(f)
	store.onPut = func(rec orphanRecord) {
		if n := len(f.driver.CallsTo("ControllerUnpublishVolume")); n != 0 {
			t.Errorf("record written after %d unpublish calls, want before any", n)
		}
	}
	deleteOnStatusPatch(f, "va-a")
	if _, err := f.driver.AddFault(csimock.Rule{Method: "ControllerUnpublishVolume", Once: true, Code: codes.Unavailable, Message: "busy"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.ctrl.syncAttach(f.ctx, "va-a"); err == nil {
		t.Fatal("syncAttach succeeded, want the failed unpublish")
	}
	if got := store.operations(); !slices.Equal(got, []string{"put va-a"}) {
		t.Fatalf("record operations = %v, want [put va-a]", got)
	}
	rec := store.recs["va-a"]
	if rec.VolumeHandle != "handle-pv-a" || rec.NodeID != "node-1-id" || rec.NodeName != "node-1" || rec.UID != "uid-va-a" || rec.SecretRef != "ns/s" {
		t.Errorf("record = %+v", rec)
	}
	f.waitFor("VA gone from the cache", func() bool { _, exists, _ := f.vaStore.GetByKey("va-a"); return !exists })
	if _, err := f.ctrl.syncAttach(f.ctx, "va-a"); err != nil {
		t.Fatalf("retry: %v", err)
	}
	if got := store.operations(); !slices.Equal(got, []string{"put va-a", "delete va-a"}) {
		t.Errorf("record operations = %v, want [put va-a delete va-a]", got)
	}
	if len(f.ctrl.orphanSnapshot()) != 0 {
		t.Errorf("orphans left: %v", f.ctrl.orphanSnapshot())
	}
	events := strings.Join(drainEvents(f.recorder), "\n")
	if !strings.Contains(events, EventOrphanedPublication) || strings.Contains(events, "hunter2") {
		t.Errorf("events = %q, want %s without secret values", events, EventOrphanedPublication)
	}
}

// Another VolumeAttachment of ours for the same volume and node ID owns the
// publication an orphan names: unpublishing would take the volume away from
// it, so the orphan is dropped without a driver call.
func TestOrphanOwnedByAnotherVolumeAttachmentIsNotUnpublished(t *testing.T) {
	f := newExecFixture(t, execPV("pv-a"), attachedVA("va-other", "pv-a"), execCSINode())
	store := withStore(f)
	store.recs["va-gone"] = orphanRecord{VolumeAttachment: "va-gone", UID: "uid-old", VolumeHandle: "handle-pv-a", NodeID: "node-1-id", NodeName: "node-1"}
	f.ctrl.loadOrphans(f.ctx)
	if _, err := f.ctrl.syncAttach(f.ctx, "va-gone"); err != nil {
		t.Fatalf("syncAttach: %v", err)
	}
	f.requireCSICalls()
	if got := store.operations(); !slices.Equal(got, []string{"delete va-gone"}) {
		t.Errorf("record operations = %v, want [delete va-gone]", got)
	}
	if len(f.ctrl.orphanSnapshot()) != 0 {
		t.Errorf("orphans left: %v", f.ctrl.orphanSnapshot())
	}
}

// With LIST_VOLUMES_PUBLISHED_NODES, the reconcile forgets orphans the
// driver no longer reports published, and keeps the others.
func TestOrphanNoLongerListedByTheDriverIsForgotten(t *testing.T) {
	f := newExecFixture(t, execCSINode())
	store := withStore(f)
	capability, err := csi.VolumeCapability(csi.CapabilityInput{AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}, FSType: "ext4"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.driver.SeedPublication("handle-kept", "node-1-id", false, capability); err != nil {
		t.Fatal(err)
	}
	store.recs["va-kept"] = orphanRecord{VolumeAttachment: "va-kept", UID: "u1", VolumeHandle: "handle-kept", NodeID: "node-1-id", NodeName: "node-1"}
	store.recs["va-gone"] = orphanRecord{VolumeAttachment: "va-gone", UID: "u2", VolumeHandle: "handle-gone", NodeID: "node-1-id", NodeName: "node-1"}
	f.ctrl.loadOrphans(f.ctx)
	if err := f.ctrl.reconcileOnce(f.ctx); err != nil {
		t.Fatalf("reconcileOnce: %v", err)
	}
	if got := store.operations(); !slices.Equal(got, []string{"delete va-gone"}) {
		t.Errorf("record operations = %v, want [delete va-gone]", got)
	}
	left := f.ctrl.orphanSnapshot()
	if _, ok := left["va-kept"]; !ok || len(left) != 1 {
		t.Errorf("orphans left = %v, want only va-kept", left)
	}
	if n := len(f.driver.CallsTo("ControllerUnpublishVolume")); n != 0 {
		t.Errorf("ControllerUnpublish calls = %d, want none from the reconcile", n)
	}
}

// failingLoadStore fails its first Loads with err.
type failingLoadStore struct {
	*memOrphanStore
	err             error
	lmu             sync.Mutex
	failures, loads int
}

func (s *failingLoadStore) Load(ctx context.Context) (map[string]orphanRecord, error) {
	s.lmu.Lock()
	s.loads++
	fail := s.loads <= s.failures
	s.lmu.Unlock()
	if fail {
		return nil, s.err
	}
	return s.memOrphanStore.Load(ctx)
}

func (s *failingLoadStore) loadCount() int {
	s.lmu.Lock()
	defer s.lmu.Unlock()
	return s.loads
}

// A record that cannot be read at start (the API server does not answer)
// is read again with backoff before anything is attached, and its orphans
// are queued once it can.
func TestOrphanRecordReadIsRetriedUntilItSucceeds(t *testing.T) {
	f := newExecFixture(t, execCSINode())
	mem := &memOrphanStore{recs: map[string]orphanRecord{
		"va-old": {VolumeAttachment: "va-old", UID: "u1", VolumeHandle: "handle-old", NodeID: "node-1-id", NodeName: "node-1"},
	}}
	store := &failingLoadStore{memOrphanStore: mem, failures: 2, err: apierrors.NewServiceUnavailable("the API server is not ready")}
	f.ctrl.exec.records = store
	f.ctrl.cfg.RetryIntervalStart, f.ctrl.cfg.RetryIntervalMax = time.Millisecond, 10*time.Millisecond
	if f.ctrl.loadOrphansOnce(f.ctx) == nil {
		t.Fatal("loadOrphansOnce reported success for a failed read")
	}
	f.ctrl.loadOrphans(f.ctx)
	if n := store.loadCount(); n != 3 {
		t.Errorf("Load calls = %d, want 3 (two failed)", n)
	}
	if _, ok := f.ctrl.orphanSnapshot()["va-old"]; !ok {
		t.Fatalf("orphans = %v, want va-old loaded", f.ctrl.orphanSnapshot())
	}
	if _, err := f.ctrl.syncAttach(f.ctx, "va-old"); err != nil {
		t.Fatalf("syncAttach: %v", err)
	}
	f.requireCSICalls("ControllerUnpublishVolume handle-old node-1-id OK")
	if got := mem.operations(); !slices.Equal(got, []string{"delete va-old"}) {
		t.Errorf("record operations = %v, want [delete va-old]", got)
	}
}

// A ControllerPublish that fails with a final code published nothing: when
// its VolumeAttachment is gone by the time attachError is written, no
// orphan is made and nothing is unpublished or recorded.
func TestPublishFinalErrorForGoneVolumeAttachmentIsNoOrphan(t *testing.T) {
	for _, code := range []codes.Code{codes.InvalidArgument, codes.NotFound, codes.FailedPrecondition, codes.Internal} {
		t.Run(code.String(), func(t *testing.T) {
			f := newExecFixture(t, execPV("pv-a"), execVA("va-a", "pv-a"), execCSINode())
			store := withStore(f)
			deleteOnStatusPatch(f, "va-a")
			if _, err := f.driver.AddFault(csimock.Rule{Method: "ControllerPublishVolume", Once: true, Code: code, Message: "refused"}); err != nil {
				t.Fatal(err)
			}
			_, err := f.ctrl.syncAttach(f.ctx, "va-a")
			if !apierrors.IsNotFound(err) {
				t.Fatalf("syncAttach = %v, want the NotFound of the attachError write", err)
			}
			f.requireCSICalls("ControllerPublishVolume handle-pv-a node-1-id " + code.String())
			if got := f.ctrl.orphanSnapshot(); len(got) != 0 {
				t.Errorf("orphans = %v, want none after a final publish error", got)
			}
			if ops := store.operations(); len(ops) != 0 {
				t.Errorf("record operations = %v, want none", ops)
			}
			if events := strings.Join(drainEvents(f.recorder), "\n"); strings.Contains(events, EventOrphanedPublication) {
				t.Errorf("events = %q, want no %s", events, EventOrphanedPublication)
			}
		})
	}
}

// A publish of unknown outcome (it took effect, the answer was Unavailable)
// whose VolumeAttachment already shows the same attachError: recordError
// writes nothing, so nothing carries the UID; a live read finds the object
// gone and the possible publication is undone.
func TestPublishUnknownOutcomeWithUnchangedAttachErrorDetectsGoneVolumeAttachment(t *testing.T) {
	for i := range 5 {
		f := newExecFixture(t, execPV("pv-a"), execVA("va-a", "pv-a"), execCSINode())
		store := withStore(f)
		// First pass: nothing published, attachError written.
		if _, err := f.driver.AddFault(csimock.Rule{Method: "ControllerPublishVolume", Once: true, Code: codes.Aborted, Message: "an operation on the volume is pending"}); err != nil {
			t.Fatal(err)
		}
		if _, err := f.ctrl.syncAttach(f.ctx, "va-a"); err == nil {
			t.Fatalf("iteration %d: first syncAttach succeeded, want the Aborted", i)
		}
		first := f.va("va-a").Status.AttachError
		if first == nil {
			t.Fatalf("iteration %d: no attachError after the first pass", i)
		}
		// Second pass: the publish takes effect, answers the same error
		// late, and the VolumeAttachment is deleted meanwhile.
		if _, err := f.driver.AddFault(csimock.Rule{Method: "ControllerPublishVolume", Once: true, Phase: csimock.PhaseAfter,
			Latency: 300 * time.Millisecond, Code: codes.Aborted, Message: "an operation on the volume is pending"}); err != nil {
			t.Fatal(err)
		}
		go func() {
			for len(f.driver.Published("handle-pv-a")) == 0 && f.ctx.Err() == nil {
				time.Sleep(2 * time.Millisecond)
			}
			_ = f.tracker.Delete(vaGVR, "", "va-a")
		}()
		if _, err := f.ctrl.syncAttach(f.ctx, "va-a"); err != nil {
			t.Fatalf("iteration %d: second syncAttach: %v, want the orphan unpublished", i, err)
		}
		f.requireCSICalls(
			"ControllerPublishVolume handle-pv-a node-1-id Aborted",
			"ControllerPublishVolume handle-pv-a node-1-id Aborted",
			"ControllerUnpublishVolume handle-pv-a node-1-id OK")
		if got := f.driver.Published("handle-pv-a"); len(got) != 0 {
			t.Errorf("iteration %d: still published to %v", i, got)
		}
		if got := store.operations(); !slices.Equal(got, []string{"put va-a", "delete va-a"}) {
			t.Errorf("iteration %d: record operations = %v, want [put va-a delete va-a]", i, got)
		}
		events := strings.Join(drainEvents(f.recorder), "\n")
		if !strings.Contains(events, EventOrphanedPublication) || !strings.Contains(events, "may have been published") {
			t.Errorf("iteration %d: events = %q, want %s saying the volume may have been published", i, events, EventOrphanedPublication)
		}
	}
}

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

// A publication orphaned by a force-deleted VolumeAttachment is still on
// the node (its unpublish keeps failing). The PV is deleted meanwhile; the
// PV queue finds no VolumeAttachment referring to it, but the pending
// orphan holds the PV (decide.OrphanHoldsPV): our PV finalizer stays, so
// the provisioner's DeleteVolume does not run on a published volume.
func TestPVFinalizerKeptWhileOrphanedPublicationIsStillPublished(t *testing.T) {
	pv := execPV("pv-a")
	pv.Finalizers = []string{kubenames.PVFinalizer(execDriver)}
	f := newExecFixture(t, pv, execVA("va-a", "pv-a"), execCSINode())
	withStore(f)
	deleteOnStatusPatch(f, "va-a")
	if _, err := f.driver.AddFault(csimock.Rule{Method: "ControllerUnpublishVolume", Code: codes.Unavailable, Message: "backend busy"}); err != nil {
		t.Fatal(err)
	}
	_, _ = f.ctrl.syncAttach(f.ctx, "va-a")
	if _, ok := f.ctrl.orphanSnapshot()["va-a"]; !ok {
		t.Fatalf("no pending orphan: %v", f.ctrl.orphanSnapshot())
	}
	f.waitFor("VA gone from the cache", func() bool { _, exists, _ := f.vaStore.GetByKey("va-a"); return !exists })

	// The PV is deleted (our finalizer keeps it).
	cur := f.pv("pv-a").DeepCopy()
	now := metav1.Now()
	cur.DeletionTimestamp = &now
	if err := f.tracker.Update(pvGVR, cur, ""); err != nil {
		t.Fatal(err)
	}
	f.waitFor("deleting PV in the cache", func() bool {
		p, _ := LookupPV(f.pvStore, "pv-a")
		return p != nil && p.DeletionTimestamp != nil
	})
	_, _ = f.ctrl.syncPV(f.ctx, "pv-a")

	published := f.driver.Published("handle-pv-a")
	got := f.pv("pv-a")
	if len(published) > 0 && !slices.Contains(got.Finalizers, kubenames.PVFinalizer(execDriver)) {
		t.Errorf("PV finalizer removed (finalizers %v) while the volume is still published to %v by a pending orphan %v",
			got.Finalizers, published, f.ctrl.orphanSnapshot())
	}
}

// A VolumeAttachment deleted while the driver publishes it (before our
// finalizer could be on the object the delete found, e.g. a stale view
// after a restart) leaves a publication nothing would ever detach: the
// status write finds the VA gone, and the attach queue unpublishes it.
func TestExecutorVADeletedDuringPublishIsUnpublishedAgain(t *testing.T) {
	f := newExecFixture(t, execPV("pv-a"), execVA("va-a", "pv-a"), execCSINode())
	deleteOnStatusPatch(f, "va-a")
	// The first unpublish fails: the key is retried until it succeeds.
	if _, err := f.driver.AddFault(csimock.Rule{Method: "ControllerUnpublishVolume", Once: true, Code: codes.Unavailable, Message: "busy"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.ctrl.syncAttach(f.ctx, "va-a"); err == nil || !strings.Contains(err.Error(), `left behind by the deleted VolumeAttachment "va-a"`) {
		t.Fatalf("syncAttach = %v, want the failed unpublish of the orphaned publication", err)
	}
	f.requireCSICalls("ControllerPublishVolume handle-pv-a node-1-id OK", "ControllerUnpublishVolume handle-pv-a node-1-id Unavailable")
	f.waitFor("VA gone from the cache", func() bool { _, exists, _ := f.vaStore.GetByKey("va-a"); return !exists })
	if _, err := f.ctrl.syncAttach(f.ctx, "va-a"); err != nil {
		t.Fatalf("retry: %v", err)
	}
	f.requireCSICalls("ControllerPublishVolume handle-pv-a node-1-id OK", "ControllerUnpublishVolume handle-pv-a node-1-id Unavailable",
		"ControllerUnpublishVolume handle-pv-a node-1-id OK")
	for _, vol := range f.driver.State().Volumes {
		if len(vol.Published) != 0 {
			t.Fatalf("volume %s still published to %+v", vol.ID, vol.Published)
		}
	}
	// Nothing left to do.
	if _, err := f.ctrl.syncAttach(f.ctx, "va-a"); err != nil {
		t.Fatalf("third pass: %v", err)
	}
	if n := len(f.csiCalls()); n != 3 {
		t.Errorf("CSI calls after the cleanup = %d, want still 3", n)
	}
}
