package attacher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/testutil"

	"github.com/latchcsi/latch/internal/csi"
	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/kube/kubenames"
	"github.com/latchcsi/latch/internal/testsupport"
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

// An old leader's write of the record lands after this attacher read it
// at start (its ControllerPublish returned after it lost the Lease): the
// attacher sees the new entry through its watch of the ConfigMap, unpublishes
// the publication the entry names and removes the entry, without a
// restart.
func TestOrphanRecordWrittenAfterStartIsSeenAndUnpublished(t *testing.T) {
	f := newExecFixture(t, execCSINode())
	const ns = "latch-system"
	f.ctrl.cfg.OrphanNamespace = ns
	f.ctrl.exec.records = newConfigMapOrphanStore(f.client, ns, execDriver)
	capability, err := csi.VolumeCapability(csi.CapabilityInput{AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}, FSType: "ext4"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.driver.SeedPublication("handle-late", "node-1-id", false, capability); err != nil {
		t.Fatal(err)
	}
	// The record as this attacher reads it at start: one entry, of a
	// publication that is gone already.
	early, _ := json.Marshal(orphanRecord{UID: "u-early", VolumeHandle: "handle-early", NodeID: "node-1-id", NodeName: "node-1"})
	cm := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: OrphanRecordName(execDriver)}, Data: map[string]string{"va-early": string(early)}}
	if cm, err = f.client.CoreV1().ConfigMaps(ns).Create(f.ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer f.run()()
	f.waitFor("the early entry settled", func() bool {
		return slices.Contains(f.csiCalls(), "ControllerUnpublishVolume handle-early node-1-id OK") && len(f.ctrl.orphanSnapshot()) == 0
	})

	// The old leader's late write.
	cur, err := f.client.CoreV1().ConfigMaps(ns).Get(f.ctx, OrphanRecordName(execDriver), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	late, _ := json.Marshal(orphanRecord{UID: "u-late", VolumeHandle: "handle-late", NodeID: "node-1-id", NodeName: "node-1"})
	cur = cur.DeepCopy()
	if cur.Data == nil {
		cur.Data = map[string]string{}
	}
	cur.Data["va-late"] = string(late)
	if _, err := f.client.CoreV1().ConfigMaps(ns).Update(f.ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.waitFor("the late entry's publication unpublished and the entry removed", func() bool {
		got, err := f.client.CoreV1().ConfigMaps(ns).Get(f.ctx, OrphanRecordName(execDriver), metav1.GetOptions{})
		_, recorded := got.Data["va-late"]
		return err == nil && !recorded && len(f.driver.Published("handle-late")) == 0
	})
	if n := slices.Index(f.csiCalls(), "ControllerUnpublishVolume handle-late node-1-id OK"); n < 0 {
		t.Errorf("CSI calls %q: want the late entry unpublished", f.csiCalls())
	}
}

// run runs the controller (its queues, the record's load and watch) until
// the returned func stops it.
func (f *execFixture) run() func() {
	ctx, stop := context.WithCancel(f.ctx)
	done := make(chan error, 1)
	go func() { done <- f.ctrl.Run(ctx) }()
	return func() {
		stop()
		if err := <-done; err != nil {
			f.t.Errorf("Run: %v", err)
		}
	}
}

// slowStartStore is a record whose Load fails (as for an API server not
// answering yet) until ready says otherwise.
type slowStartStore struct {
	*memOrphanStore
	ready func() bool
	mu    sync.Mutex
	loads int
}

func (s *slowStartStore) Load(ctx context.Context) (map[string]orphanRecord, error) {
	s.mu.Lock()
	s.loads++
	s.mu.Unlock()
	if !s.ready() {
		return nil, apierrors.NewServiceUnavailable("the API server is not ready")
	}
	return s.memOrphanStore.Load(ctx)
}

func (s *slowStartStore) loadCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.loads
}

// An earlier attacher recorded an orphan under the name of a new
// VolumeAttachment (another volume), and a PV it holds is being deleted.
// The first read of the record fails. No VolumeAttachment is attached and
// no PV finalizer removed before the record was read: the orphan is
// unpublished first, then the new VA is worked on. Here the new VA is
// force-deleted during its own publish, so it leaves an orphan of its own
// under the same name; worked on before the record was read, that second
// orphan's record would overwrite (then remove) the first one's, whose
// publication nothing would ever unpublish, and the PV's volume would be
// deleted while still published.
func TestOrphanRecordReadFailingAtStartDelaysAttachesUntilItsOrphansAreKnown(t *testing.T) {
	pvOld := deleting(execPV("pv-old"))
	pvOld.Finalizers = []string{kubenames.PVFinalizer(execDriver)}
	f := newExecFixture(t, execPV("pv-a"), pvOld, execVA("va-a", "pv-a"), execCSINode())
	capability, err := csi.VolumeCapability(csi.CapabilityInput{AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}, FSType: "ext4"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.driver.SeedPublication("handle-pv-old", "node-1-id", false, capability); err != nil {
		t.Fatal(err)
	}
	mem := &memOrphanStore{recs: map[string]orphanRecord{
		"va-a": {VolumeAttachment: "va-a", UID: "uid-va-a-old", VolumeHandle: "handle-pv-old", NodeID: "node-1-id", NodeName: "node-1", PersistentVolume: "pv-old"},
	}}
	// The record cannot be read until something was published, or for
	// 300 ms.
	var first time.Time
	store := &slowStartStore{memOrphanStore: mem, ready: func() bool {
		if first.IsZero() {
			first = time.Now()
		}
		return len(f.driver.CallsTo("ControllerPublishVolume")) > 0 || time.Since(first) > 300*time.Millisecond
	}}
	f.ctrl.exec.records = store
	f.ctrl.cfg.RetryIntervalStart, f.ctrl.cfg.RetryIntervalMax = 10*time.Millisecond, 50*time.Millisecond
	deleteOnStatusPatch(f, "va-a")
	// When our finalizer leaves pv-old, is its volume still published?
	var pvReleasedWhilePublished []string
	var pvMu sync.Mutex
	pvReleased := false
	f.client.PrependReactor("patch", "persistentvolumes", func(action clienttesting.Action) (bool, runtime.Object, error) {
		if action.(clienttesting.PatchAction).GetName() == "pv-old" {
			pvMu.Lock()
			pvReleased = true
			pvReleasedWhilePublished = f.driver.Published("handle-pv-old")
			pvMu.Unlock()
		}
		return false, nil, nil
	})

	runCtx, stop := context.WithCancel(f.ctx)
	done := make(chan error, 1)
	go func() { done <- f.ctrl.Run(runCtx) }()
	settled := func() bool {
		pvMu.Lock()
		defer pvMu.Unlock()
		return pvReleased && len(f.driver.Published("handle-pv-old")) == 0 && len(f.driver.Published("handle-pv-a")) == 0 &&
			len(f.ctrl.orphanSnapshot()) == 0 && store.loadCount() > 1
	}
	werr := testsupport.Poll(f.ctx, 5*time.Second, func(context.Context) (bool, error) { return settled(), nil })
	stop()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	if werr != nil {
		pvMu.Lock()
		defer pvMu.Unlock()
		t.Fatalf("not settled: handle-pv-old published to %v, handle-pv-a to %v; pv-old released %v; orphans %v; record %v (ops %v); CSI calls %q",
			f.driver.Published("handle-pv-old"), f.driver.Published("handle-pv-a"), pvReleased, f.ctrl.orphanSnapshot(), mem.recs, mem.operations(), f.csiCalls())
	}
	calls := f.csiCalls()
	if len(calls) == 0 || calls[0] != "ControllerUnpublishVolume handle-pv-old node-1-id OK" {
		t.Errorf("CSI calls = %q, want the recorded orphan unpublished before anything else", calls)
	}
	if i := slices.Index(calls, "ControllerPublishVolume handle-pv-a node-1-id OK"); i < 0 {
		t.Errorf("CSI calls = %q, want va-a published once the orphan was undone", calls)
	}
	if len(pvReleasedWhilePublished) != 0 {
		t.Errorf("our finalizer left pv-old while its volume was still published to %v", pvReleasedWhilePublished)
	}
	if got := mem.operations(); !slices.Equal(got, []string{"delete va-a", "put va-a", "delete va-a"}) {
		t.Errorf("record operations = %v, want %v", got, fmt.Sprint([]string{"delete va-a", "put va-a", "delete va-a"}))
	}
}

// An entry of the record that is not a valid record (hand-edited) is
// ignored and counted; the valid entries load and attaches are not held
// back by it.
func TestOrphanRecordWithAnInvalidEntryLoadsTheValidOnes(t *testing.T) {
	client := fake.NewClientset(&v1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: OrphanRecordName("drv.example.com")},
		Data: map[string]string{
			"va-good": `{"uid":"u1","volumeHandle":"h1","nodeID":"n1"}`,
			"va-bad":  `not json`,
			"va-half": `{"uid":"u2","volumeHandle":"h2"}`,
		},
	})
	store := newConfigMapOrphanStore(client, "ns", "drv.example.com")
	recs, err := store.Load(context.Background())
	var invalid *invalidRecordsError
	if !errors.As(err, &invalid) || !slices.Equal(invalid.keys, []string{"va-bad", "va-half"}) {
		t.Fatalf("Load error = %v, want the invalid entries va-bad and va-half named", err)
	}
	if len(recs) != 1 || recs["va-good"].VolumeHandle != "h1" || recs["va-good"].NodeID != "n1" {
		t.Fatalf("Load records = %+v, want only va-good (h1 on n1)", recs)
	}
}

// csi-attacher runs with a driver's usual Lease-only Role: the API server
// forbids reading the orphan record. Attaches are not held back: the
// VolumeAttachment is attached, with orphans tracked in memory only, and
// the Lease gets a Warning OrphanRecordFailed event naming the ConfigMap
// and the exact Role rule to add; the errors are counted and
// latch_attacher_orphan_record_unavailable is 1. The read is retried in
// the background: once RBAC allows it, the record's entry is settled and
// the gauge is 0 again.
func TestOrphanRecordForbiddenAttachesAnywayAndSaysWhy(t *testing.T) {
	f := newExecFixture(t, execPV("pv-a"), execVA("va-a", "pv-a"), execCSINode())
	f.ctrl.cfg.OrphanNamespace = "latch-system"
	f.ctrl.cfg.RetryIntervalStart, f.ctrl.cfg.RetryIntervalMax = 5*time.Millisecond, 20*time.Millisecond
	f.recorder.IncludeObject = true
	m := NewMetrics()
	m.Register(metrics.NewKubeRegistry().MustRegister)
	f.ctrl.exec.metrics = m
	capability, err := csi.VolumeCapability(csi.CapabilityInput{AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}, FSType: "ext4"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.driver.SeedPublication("handle-old", "node-1-id", false, capability); err != nil {
		t.Fatal(err)
	}
	mem := &memOrphanStore{recs: map[string]orphanRecord{
		"va-old": {VolumeAttachment: "va-old", UID: "u-old", VolumeHandle: "handle-old", NodeID: "node-1-id", NodeName: "node-1"},
	}}
	forbidden := apierrors.NewForbidden(v1.Resource("configmaps"), OrphanRecordName(execDriver),
		errors.New(`User "system:serviceaccount:latch-system:csi-attacher" cannot get resource "configmaps" in API group "" in the namespace "latch-system"`))
	store := &failingLoadStore{memOrphanStore: mem, err: forbidden, failures: 1 << 30}
	f.ctrl.exec.records = store

	defer f.run()()
	f.waitFor("va-a attached although the record cannot be read", func() bool { return f.va("va-a").Status.Attached })
	f.waitFor("the read retried", func() bool { return store.loadCount() > 2 })
	var leaseEvent string
	for _, e := range drainEvents(f.recorder) {
		if strings.Contains(e, "kind=Lease") && strings.Contains(e, "Warning "+EventOrphanRecordFailed) {
			leaseEvent = e
		}
	}
	for _, want := range []string{"latch-system/" + OrphanRecordName(execDriver), "RBAC forbids it", "in memory only",
		`resourceNames: ["` + OrphanRecordName(execDriver) + `"], verbs: ["get", "list", "watch", "update"]`, `verbs: ["create"]`, `namespace "latch-system"`} {
		if !strings.Contains(leaseEvent, want) {
			t.Errorf("Warning %s event on the Lease %q does not say %q", EventOrphanRecordFailed, leaseEvent, want)
		}
	}
	if got, _ := testutil.GetGaugeMetricValue(m.orphanRecordUnavailable); got != 1 {
		t.Errorf("latch_attacher_orphan_record_unavailable = %v, want 1", got)
	}
	if got, _ := testutil.GetCounterMetricValue(m.orphanRecordErrors.WithLabelValues("load")); got < 2 {
		t.Errorf("latch_attacher_orphan_record_errors_total{operation=load} = %v, want every refused read counted", got)
	}
	if got := f.driver.Published("handle-old"); len(got) != 1 {
		t.Fatalf("handle-old published to %v before the record could be read, want still published", got)
	}

	// RBAC is fixed: the next retry reads the record and settles its entry.
	store.lmu.Lock()
	store.failures = 0
	store.lmu.Unlock()
	f.waitFor("the recorded orphan unpublished once the record could be read", func() bool { return len(f.driver.Published("handle-old")) == 0 })
	f.waitFor("the gauge back to 0", func() bool { got, _ := testutil.GetGaugeMetricValue(m.orphanRecordUnavailable); return got == 0 })
	f.waitFor("a Normal event on the Lease saying the record is available again", func() bool {
		for _, e := range drainEvents(f.recorder) {
			if strings.Contains(e, "kind=Lease") && strings.HasPrefix(e, "Normal "+EventOrphanRecordAvailable) {
				return true
			}
		}
		return false
	})
}

// unwritableStore is a record whose Puts or Deletes fail with err.
type unwritableStore struct {
	*memOrphanStore
	putErr, deleteErr error
}

func (s *unwritableStore) Put(ctx context.Context, rec orphanRecord) error {
	if s.putErr != nil {
		return s.putErr
	}
	return s.memOrphanStore.Put(ctx, rec)
}

func (s *unwritableStore) Delete(ctx context.Context, rec orphanRecord) error {
	if s.deleteErr != nil {
		return s.deleteErr
	}
	return s.memOrphanStore.Delete(ctx, rec)
}

// The API server's answers to a write of a record it will not store.
var unwritableShapes = []struct {
	name string
	err  error
	// want is what the VolumeAttachment's message must say about it.
	want string
}{
	{"immutable ConfigMap", apierrors.NewInvalid(v1.SchemeGroupVersion.WithKind("ConfigMap").GroupKind(), "external-attacher-orphans-x",
		field.ErrorList{field.Forbidden(field.NewPath("data"), "field is immutable when `immutable` is set")}), "re-create it without immutable"},
	{"data key that is also a binaryData key", apierrors.NewInvalid(v1.SchemeGroupVersion.WithKind("ConfigMap").GroupKind(), "external-attacher-orphans-x",
		field.ErrorList{field.Invalid(field.NewPath("data").Key("va-a"), "va-a", "duplicate of key present in binaryData")}), "binaryData"},
	{"RBAC that forbids it", apierrors.NewForbidden(v1.Resource("configmaps"), "external-attacher-orphans-x", errors.New(`User "system:serviceaccount:latch-system:csi-attacher" cannot update resource "configmaps"`)),
		`resourceNames: ["external-attacher-orphans-executor-csi-latch-dev"], verbs: ["get", "list", "watch", "update"]`},
}

// A record that cannot be written does not hold an orphan, or the new
// VolumeAttachment of its name, forever. va-a is force-deleted during its
// publish; its first two unpublishes fail. A new va-a (another node) waits
// for the orphan. For each way the API server refuses the record:
//
//   - the write of the entry fails: the new VolumeAttachment's attachError
//     says the orphan is in memory only and why, a Warning
//     OrphanRecordFailed event names the cause, and once the driver
//     unpublished it the new VolumeAttachment is attached;
//   - the entry was written, but its removal fails: once the driver
//     unpublished it the orphan is forgotten all the same (a Warning
//     OrphanRecordFailed event says the entry stayed) and the new
//     VolumeAttachment is attached.
//
// Both count in latch_attacher_orphan_record_errors_total and set
// latch_attacher_orphan_record_unavailable.
func TestOrphanRecordThatCannotBeWrittenHoldsNothingForever(t *testing.T) {
	for _, shape := range unwritableShapes {
		for _, op := range []string{"put", "delete"} {
			t.Run(shape.name+"/"+op, func(t *testing.T) {
				f := newExecFixture(t, execPV("pv-a"), execVA("va-a", "pv-a"), execCSINode(), csiNodeOf("node-2", "node-2-id"))
				f.ctrl.cfg.OrphanNamespace = "latch-system"
				m := NewMetrics()
				m.Register(metrics.NewKubeRegistry().MustRegister)
				f.ctrl.exec.metrics = m
				store := &unwritableStore{memOrphanStore: &memOrphanStore{recs: map[string]orphanRecord{}}}
				if op == "put" {
					store.putErr = shape.err
				} else {
					store.deleteErr = shape.err
				}
				f.ctrl.exec.records = store
				forceDeleteOnFirstStatusPatch(f, "va-a")
				if _, err := f.driver.AddFault(csimock.Rule{Method: "ControllerUnpublishVolume", Times: 2, Code: codes.Unavailable, Message: "backend unreachable"}); err != nil {
					t.Fatal(err)
				}
				if _, err := f.ctrl.syncAttach(f.ctx, "va-a"); err == nil {
					t.Fatal("pass 1 succeeded, want the orphan's failed unpublish")
				}
				f.waitFor("old va-a gone from the cache", func() bool { _, exists, _ := f.vaStore.GetByKey("va-a"); return !exists })
				newVA := execVA("va-a", "pv-a")
				newVA.UID, newVA.Spec.NodeName = types.UID("uid-va-a-2"), "node-2"
				if err := f.tracker.Add(newVA); err != nil {
					t.Fatal(err)
				}
				f.waitFor("new va-a in the cache", func() bool { va, _ := LookupVA(f.vaStore, "va-a"); return va != nil && va.UID == "uid-va-a-2" })

				// Pass 2: the unpublish fails again; the new VA waits.
				if _, err := f.ctrl.syncAttach(f.ctx, "va-a"); err == nil {
					t.Fatal("pass 2 succeeded, want the orphan's failed unpublish")
				}
				ae := f.va("va-a").Status.AttachError
				if ae == nil || !strings.Contains(ae.Message, "waiting for the publication of volume") {
					t.Fatalf("new va-a attachError = %+v, want it to say it waits for the orphan", ae)
				}
				if op == "put" {
					for _, want := range []string{"tracked in memory only", "latch-system/external-attacher-orphans-", shape.want} {
						if !strings.Contains(ae.Message, want) {
							t.Errorf("new va-a attachError %q does not say %q", ae.Message, want)
						}
					}
				}
				if got, _ := testutil.GetGaugeMetricValue(m.orphanRecordUnavailable); op == "put" && got != 1 {
					t.Errorf("latch_attacher_orphan_record_unavailable = %v after a refused write, want 1", got)
				}

				// Pass 3: the driver unpublishes; the new VA is attached.
				if _, err := f.ctrl.syncAttach(f.ctx, "va-a"); err != nil {
					t.Fatalf("pass 3: %v", err)
				}
				f.requireCSICalls(
					"ControllerPublishVolume handle-pv-a node-1-id OK",
					"ControllerUnpublishVolume handle-pv-a node-1-id Unavailable",
					"ControllerUnpublishVolume handle-pv-a node-1-id Unavailable",
					"ControllerUnpublishVolume handle-pv-a node-1-id OK",
					"ControllerPublishVolume handle-pv-a node-2-id OK")
				if va := f.va("va-a"); !va.Status.Attached || va.Status.AttachError != nil {
					t.Errorf("new va-a status = %+v, want attached", va.Status)
				}
				if left := f.ctrl.orphanSnapshot(); len(left) != 0 {
					t.Errorf("orphans left = %v, want none", left)
				}
				recordFailed := 0
				for _, e := range drainEvents(f.recorder) {
					if strings.HasPrefix(e, "Warning "+EventOrphanRecordFailed) && strings.Contains(e, shape.want) {
						recordFailed++
					}
				}
				if recordFailed != 1 {
					t.Errorf("%d Warning %s events naming the cause, want 1", recordFailed, EventOrphanRecordFailed)
				}
				if got, _ := testutil.GetCounterMetricValue(m.orphanRecordErrors.WithLabelValues(op)); got < 1 {
					t.Errorf("latch_attacher_orphan_record_errors_total{operation=%q} = %v, want the failure counted", op, got)
				}
			})
		}
	}
}
