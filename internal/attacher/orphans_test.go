package attacher

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/latchcsi/latch/internal/csi"
	"github.com/latchcsi/latch/internal/csimock"
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
