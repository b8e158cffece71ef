package attacher

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/latchcsi/latch/internal/csi"
	"github.com/latchcsi/latch/internal/kube/kubenames"
)

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
	werr := wait.PollUntilContextTimeout(f.ctx, 10*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) { return settled(), nil })
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
