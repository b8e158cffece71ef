package attacher

import (
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clienttesting "k8s.io/client-go/testing"

	"github.com/latchcsi/latch/internal/csi"
	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// An orphaned publication is taken over by a new VolumeAttachment of the
// same name for the same volume and node ID only once that VA carries our
// finalizer (decide.OwnerOnceRecorded). Here the new VA is deleted before
// our metadata write lands (the attach/detach controller deletes a VA it
// just created when the Pod goes away: no finalizer, so the object is gone
// at once): the orphan is still pending, and the next pass of the name
// unpublishes the volume.
func TestOrphanStaysUntilTheNewVAsFinalizerLandsAndIsUnpublishedWhenTheVAGoesFirst(t *testing.T) {
	f := newExecFixture(t, execPV("pv-a"), execVA("va-a", "pv-a"), execCSINode())
	store := withStore(f)

	// Pass 1: the publish succeeds, the VA is force-deleted meanwhile
	// (status write answers NotFound): an orphan. Its first unpublish fails
	// transiently, so the orphan stays pending.
	statusDeleted := false
	f.client.PrependReactor("patch", "volumeattachments", func(action clienttesting.Action) (bool, runtime.Object, error) {
		if action.GetSubresource() != "status" || statusDeleted {
			return false, nil, nil
		}
		statusDeleted = true
		if err := f.tracker.Delete(vaGVR, "", "va-a"); err != nil {
			return true, nil, err
		}
		return true, nil, apierrors.NewNotFound(vaGVR.GroupResource(), "va-a")
	})
	if _, err := f.driver.AddFault(csimock.Rule{Method: "ControllerUnpublishVolume", Once: true, Code: codes.Unavailable, Message: "busy"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.ctrl.syncAttach(f.ctx, "va-a"); err == nil {
		t.Fatal("pass 1 succeeded, want the failed orphan unpublish")
	}
	if _, ok := f.ctrl.orphanSnapshot()["va-a"]; !ok {
		t.Fatalf("no orphan pending after pass 1: %v", f.ctrl.orphanSnapshot())
	}
	f.waitFor("old VA gone from the cache", func() bool { _, exists, _ := f.vaStore.GetByKey("va-a"); return !exists })

	// The attach/detach controller creates a new VA of the same name (same
	// volume, same node) ...
	newVA := execVA("va-a", "pv-a")
	newVA.UID = types.UID("uid-va-a-2")
	if err := f.tracker.Add(newVA); err != nil {
		t.Fatal(err)
	}
	f.waitFor("new VA in the cache", func() bool {
		va, _ := LookupVA(f.vaStore, "va-a")
		return va != nil && va.UID == "uid-va-a-2"
	})
	// ... and deletes it again (the Pod went away) just before our
	// finalizer write lands: the VA has no finalizer, so it is gone.
	f.client.PrependReactor("patch", "volumeattachments", func(action clienttesting.Action) (bool, runtime.Object, error) {
		if action.GetSubresource() != "" {
			return false, nil, nil
		}
		_ = f.tracker.Delete(vaGVR, "", "va-a")
		return true, nil, apierrors.NewNotFound(vaGVR.GroupResource(), "va-a")
	})
	_, _ = f.ctrl.syncAttach(f.ctx, "va-a")
	f.waitFor("new VA gone from the cache", func() bool { _, exists, _ := f.vaStore.GetByKey("va-a"); return !exists })
	// The key's retries, and the detach queue, find nothing to do.
	for range 3 {
		_, _ = f.ctrl.syncAttach(f.ctx, "va-a")
		_, _ = f.ctrl.syncDetach(f.ctx, "va-a")
	}

	if got := f.driver.Published("handle-pv-a"); len(got) != 0 {
		t.Errorf("volume handle-pv-a still published to %v with no VolumeAttachment and no orphan left to unpublish it (orphans %v, record ops %v); CSI calls %q",
			got, f.ctrl.orphanSnapshot(), store.operations(), f.csiCalls())
	}
}

// A new VolumeAttachment of the same name for the same volume and node ID
// is worked on while the orphan waits for its finalizer; once its pass
// wrote the finalizer (and published: idempotent), it takes the
// publication over in that same pass: no unpublish, the record removed.
func TestOrphanTakenOverByNewVAOnceItsFinalizerLandsWithoutUnpublish(t *testing.T) {
	f := newExecFixture(t, execPV("pv-a"), execCSINode())
	store := withStore(f)
	store.recs["va-a"] = orphanRecord{VolumeAttachment: "va-a", UID: "uid-old", VolumeHandle: "handle-pv-a", NodeID: "node-1-id", NodeName: "node-1", PersistentVolume: "pv-a"}
	f.ctrl.loadOrphans(f.ctx)
	newVA := execVA("va-a", "pv-a")
	if err := f.tracker.Add(newVA); err != nil {
		t.Fatal(err)
	}
	f.waitFor("new VA in the cache", func() bool { va, _ := LookupVA(f.vaStore, "va-a"); return va != nil })
	if _, err := f.ctrl.syncAttach(f.ctx, "va-a"); err != nil {
		t.Fatalf("syncAttach: %v", err)
	}
	f.requireCSICalls("ControllerPublishVolume handle-pv-a node-1-id OK")
	if got := store.operations(); !slices.Equal(got, []string{"delete va-a"}) {
		t.Errorf("record operations = %v, want [delete va-a]", got)
	}
	if left := f.ctrl.orphanSnapshot(); len(left) != 0 {
		t.Errorf("orphans left = %v, want none", left)
	}
	if va := f.va("va-a"); !va.Status.Attached {
		t.Errorf("new VA not attached: %+v", va.Status)
	}
}

// secretsSeenCSI records the secrets each ControllerUnpublish was handed.
type secretsSeenCSI struct {
	CSIClient
	mu   sync.Mutex
	seen []map[string]string
}

func (s *secretsSeenCSI) ControllerUnpublish(ctx context.Context, handle, nodeID string, secrets map[string]string) error {
	s.mu.Lock()
	s.seen = append(s.seen, maps.Clone(secrets))
	s.mu.Unlock()
	return s.CSIClient.ControllerUnpublish(ctx, handle, nodeID, secrets)
}

// secretReads lists "namespace/name" of every Secret the controller read.
func (f *execFixture) secretReads() []string {
	var out []string
	for _, a := range f.client.Actions() {
		if g, ok := a.(clienttesting.GetAction); ok && a.GetResource().Resource == "secrets" {
			out = append(out, g.GetNamespace()+"/"+g.GetName())
		}
	}
	return out
}

// An entry of the orphan record is not a trust boundary: whoever may write
// ConfigMaps in the attacher's namespace could otherwise detach any volume
// of the driver. Each case writes an entry naming the volume and node ID
// that an attached VolumeAttachment with our finalizer (va-live) claims
// while its Pod runs: the entry is never unpublished, it is dropped, and
// the record's ConfigMap gets a Warning event saying it was not acted on.
func TestOrphanRecordEntryNeverUnpublishesWhatAnAttachedVolumeAttachmentClaims(t *testing.T) {
	cases := []struct {
		name  string
		entry orphanRecord
	}{
		{"no node name", orphanRecord{VolumeAttachment: "va-forged", UID: "uid-forged", VolumeHandle: "handle-pv-a", NodeID: "node-1-id"}},
		{"another node name than the claiming VolumeAttachment's", orphanRecord{VolumeAttachment: "va-forged", UID: "uid-forged", VolumeHandle: "handle-pv-a", NodeID: "node-1-id", NodeName: "node-9"}},
		{"the claiming VolumeAttachment's own name and uid", orphanRecord{VolumeAttachment: "va-live", UID: "uid-va-live", VolumeHandle: "handle-pv-a", NodeID: "node-1-id", NodeName: "node-1"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newExecFixture(t, execPV("pv-a"), attachedVA("va-live", "pv-a"), execCSINode())
			f.ctrl.cfg.OrphanNamespace = "latch-system"
			store := withStore(f)
			store.recs[tc.entry.VolumeAttachment] = tc.entry
			f.ctrl.loadOrphans(f.ctx)
			for _, name := range []string{tc.entry.VolumeAttachment, "va-live"} {
				if _, err := f.ctrl.syncAttach(f.ctx, name); err != nil {
					t.Fatalf("syncAttach %s: %v", name, err)
				}
			}
			f.requireCSICalls()
			if left := f.ctrl.orphanSnapshot(); len(left) != 0 {
				t.Errorf("orphans left = %v, want none", left)
			}
			if p := f.ctrl.pending(); len(p) != 0 {
				t.Errorf("pending publications = %+v, want none", p)
			}
			events := drainEvents(f.recorder)
			found := false
			for _, e := range events {
				found = found || strings.HasPrefix(e, "Warning "+EventOrphanRecordIgnored) && strings.Contains(e, tc.entry.VolumeAttachment) && strings.Contains(e, "handle-pv-a")
			}
			if !found {
				t.Errorf("events = %q, want a Warning %s naming entry %s and its volume", events, EventOrphanRecordIgnored, tc.entry.VolumeAttachment)
			}
			if va := f.va("va-live"); !va.Status.Attached {
				t.Errorf("va-live status = %+v, want still attached", va.Status)
			}
		})
	}
}

// An entry's secretRef names another Secret than the PersistentVolume's
// controller-publish secret: csi-attacher never reads it and never hands
// it to the driver. The unpublish of the (corroborated) entry uses the
// Secret the PV names; when the PV the entry names is another volume's,
// none.
func TestOrphanRecordEntrySecretRefIsNeverRead(t *testing.T) {
	cases := []struct {
		name, handle string
		wantReads    []string
		wantSecrets  map[string]string
	}{
		{"the PV names another secret", "handle-pv-a", []string{"ns/s"}, map[string]string{"password": "pv-secret"}},
		{"the PV is another volume's", "handle-x", nil, map[string]string{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pv := execPV("pv-a")
			pv.Finalizers = []string{kubenames.PVFinalizer(execDriver)}
			pv.Spec.CSI.ControllerPublishSecretRef = &v1.SecretReference{Namespace: "ns", Name: "s"}
			pvSecret := &v1.Secret{Data: map[string][]byte{"password": []byte("pv-secret")}}
			pvSecret.Namespace, pvSecret.Name = "ns", "s"
			admin := &v1.Secret{Data: map[string][]byte{"token": []byte("cluster-admin")}}
			admin.Namespace, admin.Name = "kube-system", "admin-creds"
			f := newExecFixture(t, pv, execCSINode(), pvSecret, admin)
			store := withStore(f)
			store.recs["va-gone"] = orphanRecord{VolumeAttachment: "va-gone", UID: "uid-old", VolumeHandle: tc.handle, NodeID: "node-1-id",
				NodeName: "node-1", PersistentVolume: "pv-a", SecretRef: "kube-system/admin-creds"}
			csi := &secretsSeenCSI{CSIClient: f.ctrl.exec.csi}
			f.ctrl.exec.csi = csi
			f.ctrl.loadOrphans(f.ctx)
			if _, err := f.ctrl.syncAttach(f.ctx, "va-gone"); err != nil {
				t.Fatalf("syncAttach: %v", err)
			}
			f.requireCSICalls("ControllerUnpublishVolume " + tc.handle + " node-1-id OK")
			if reads := f.secretReads(); !slices.Equal(reads, tc.wantReads) {
				t.Errorf("Secrets read: %v, want %v", reads, tc.wantReads)
			}
			if len(csi.seen) != 1 || !maps.Equal(csi.seen[0], tc.wantSecrets) {
				t.Errorf("secrets handed to ControllerUnpublish = %v, want %v", csi.seen, tc.wantSecrets)
			}
		})
	}
}

// gatedListingCSI holds every ListVolumes until open is closed.
type gatedListingCSI struct {
	CSIClient
	open chan struct{}
}

func (g *gatedListingCSI) ListVolumes(ctx context.Context, maxEntries int32) (map[string][]string, error) {
	select {
	case <-g.open:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return g.CSIClient.ListVolumes(ctx, maxEntries)
}

// With a driver that lists publications, an entry of the record is
// unpublished only once a listing shows its volume published on its node
// ID; a listing that does not show it forgets it, with no unpublish. The
// entries read at start are listed at once, not a --reconcile-sync later.
func TestOrphanRecordEntryIsUnpublishedOnlyOnceAListingShowsIt(t *testing.T) {
	f := newExecFixture(t, execCSINode())
	f.ctrl.cfg.ReconcileSync = time.Hour // the driver lists; no periodic listing comes in this test
	gate := &gatedListingCSI{CSIClient: f.ctrl.exec.csi, open: make(chan struct{})}
	f.ctrl.exec.csi = gate
	store := withStore(f)
	capability, err := csi.VolumeCapability(csi.CapabilityInput{AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}, FSType: "ext4"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.driver.SeedPublication("handle-listed", "node-1-id", false, capability); err != nil {
		t.Fatal(err)
	}
	store.recs["va-listed"] = orphanRecord{VolumeAttachment: "va-listed", UID: "u1", VolumeHandle: "handle-listed", NodeID: "node-1-id", NodeName: "node-1"}
	store.recs["va-unlisted"] = orphanRecord{VolumeAttachment: "va-unlisted", UID: "u2", VolumeHandle: "handle-unlisted", NodeID: "node-1-id", NodeName: "node-1", Uncertain: true}
	f.ctrl.loadOrphans(f.ctx)
	for _, name := range []string{"va-listed", "va-unlisted"} {
		if _, err := f.ctrl.syncAttach(f.ctx, name); err == nil || !strings.Contains(err.Error(), "ListVolumes") {
			t.Fatalf("syncAttach %s before a listing = %v, want it to wait for a listing", name, err)
		}
	}
	f.requireCSICalls()
	close(gate.open) // the listing the adoption started answers
	f.waitFor("the listing applied", func() bool {
		left := f.ctrl.orphanSnapshot()
		return len(left) == 1 && left["va-listed"].listed
	})
	if _, err := f.ctrl.syncAttach(f.ctx, "va-listed"); err != nil {
		t.Fatalf("syncAttach va-listed after the listing: %v", err)
	}
	f.requireCSICalls("ControllerUnpublishVolume handle-listed node-1-id OK")
	if got := store.operations(); !slices.Equal(got, []string{"delete va-unlisted", "delete va-listed"}) {
		t.Errorf("record operations = %v, want both entries removed", got)
	}
}
