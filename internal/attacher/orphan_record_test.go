package attacher

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/latchcsi/latch/internal/csimock"
)

// listingHookCSI runs during its first ListVolumes, before the driver
// answers: what the attach queue does while a listing is under way.
type listingHookCSI struct {
	CSIClient
	during func()
}

func (l *listingHookCSI) ListVolumes(ctx context.Context, maxEntries int32) (map[string][]string, error) {
	if l.during != nil {
		during := l.during
		l.during = nil
		during()
	}
	return l.CSIClient.ListVolumes(ctx, maxEntries)
}

// While a ListVolumes listing is under way, the attach queue unpublishes
// the orphan recorded under va-a, and a new VolumeAttachment va-a, deleted
// during its own publish, leaves a new orphan under that name whose first
// unpublish fails. The listing, which does not show the first orphan's
// volume any more, forgets the first orphan: that removes nothing of the
// new orphan, whose record stays for a restarted attacher to find.
func TestOrphanForgottenByListingDoesNotRemoveTheRecordOfANewOrphanOfTheSameName(t *testing.T) {
	f := newExecFixture(t, execPV("pv-a"), execCSINode())
	store := withStore(f)
	store.recs["va-a"] = orphanRecord{VolumeAttachment: "va-a", UID: "uid-va-a-old", VolumeHandle: "handle-old", NodeID: "node-1-id", NodeName: "node-1"}
	f.ctrl.loadOrphans(f.ctx)
	f.ctrl.exec.csi = &listingHookCSI{CSIClient: f.ctrl.exec.csi, during: func() {
		// The first orphan is undone (no VolumeAttachment va-a now).
		if _, err := f.ctrl.syncAttach(f.ctx, "va-a"); err != nil {
			t.Fatalf("undo the first orphan: %v", err)
		}
		// A new va-a, force-deleted while it is published.
		newVA := execVA("va-a", "pv-a")
		if err := f.tracker.Add(newVA); err != nil {
			t.Fatal(err)
		}
		f.waitFor("new VA in the cache", func() bool { va, _ := LookupVA(f.vaStore, "va-a"); return va != nil })
		deleteOnStatusPatch(f, "va-a")
		if _, err := f.driver.AddFault(csimock.Rule{Method: "ControllerUnpublishVolume", Once: true, Code: codes.Unavailable, Message: "busy"}); err != nil {
			t.Fatal(err)
		}
		if _, err := f.ctrl.syncAttach(f.ctx, "va-a"); err == nil {
			t.Fatal("pass of the new VA succeeded, want its orphan's failed unpublish")
		}
	}}
	if err := f.ctrl.reconcileOnce(f.ctx); err != nil {
		t.Fatalf("reconcileOnce: %v", err)
	}
	f.requireCSICalls(
		"ControllerUnpublishVolume handle-old node-1-id OK",
		"ControllerPublishVolume handle-pv-a node-1-id OK",
		"ControllerUnpublishVolume handle-pv-a node-1-id Unavailable")
	if o, ok := f.ctrl.orphanSnapshot()["va-a"]; !ok || o.uid != "uid-va-a" {
		t.Fatalf("orphans = %v, want the new VA's pending", f.ctrl.orphanSnapshot())
	}
	rec, ok := store.recs["va-a"]
	if !ok || rec.UID != types.UID("uid-va-a") || rec.VolumeHandle != "handle-pv-a" {
		t.Fatalf("record of va-a = %+v (present %v), want the new orphan's (uid-va-a, handle-pv-a): a restart would lose it; record operations %v",
			rec, ok, store.operations())
	}
}

// The ConfigMap record removes an entry only while it holds the orphan
// being dropped: the entry of a newer orphan of the same name stays.
func TestOrphanConfigMapRecordKeepsTheEntryOfANewerOrphanOfTheSameName(t *testing.T) {
	ctx := context.Background()
	client, _, _ := newWatchedRVClientset() // sets resourceVersions as the API server does
	store := newConfigMapOrphanStore(client, "kube-system", execDriver)
	old := orphanRecord{VolumeAttachment: "va-a", UID: "uid-old", VolumeHandle: "handle-old", NodeID: "node-1-id"}
	newer := orphanRecord{VolumeAttachment: "va-a", UID: "uid-new", VolumeHandle: "handle-new", NodeID: "node-1-id"}
	if err := store.Put(ctx, old); err != nil {
		t.Fatal(err)
	}
	if err := store.Put(ctx, newer); err != nil {
		t.Fatal(err)
	}
	if err := store.Delete(ctx, old); err != nil {
		t.Fatalf("Delete of the older orphan: %v", err)
	}
	// A restarted attacher reads the ConfigMap afresh.
	recs, err := newConfigMapOrphanStore(client, "kube-system", execDriver).Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := recs["va-a"]; !ok || !sameRecord(got, newer) {
		t.Fatalf("records = %+v, want the newer orphan of va-a kept", recs)
	}
	if err := store.Delete(ctx, newer); err != nil {
		t.Fatalf("Delete of the newer orphan: %v", err)
	}
	cm, err := client.CoreV1().ConfigMaps("kube-system").Get(ctx, OrphanRecordName(execDriver), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(cm.Data) != 0 {
		t.Errorf("ConfigMap data = %v, want empty", cm.Data)
	}
}
