package attacher

import (
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	clienttesting "k8s.io/client-go/testing"

	"github.com/latchcsi/latch/internal/csi"
	"github.com/latchcsi/latch/internal/kube/kubenames"
)

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
