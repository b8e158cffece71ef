package controller

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/component-base/metrics/testutil"
)

// An admission policy refuses the controller's VolumeAttachment create.
// Each refused create puts a Warning FailedAttachVolume event with
// kube-controller-manager's text on the Pod and counts in
// latch_attachdetach_volumeattachment_create_errors_total by the API's
// reason; the create is retried with the key's backoff (the waits
// between refused creates grow); once the API server takes the create,
// the VolumeAttachment exists and nothing more is reported.
func TestCreateRefused_eachAttemptReportedOnThePodAndCounted_retriedWithBackoffUntilAllowed(t *testing.T) {
	const start = 100 * time.Millisecond
	pv, pvc := boundClaim("vol-1", v1.ReadWriteOnce)
	name := upstreamVAName("vol-1", testDriver, "node-a")
	refusal := apierrors.NewForbidden(schema.GroupResource{Group: "storage.k8s.io", Resource: "volumeattachments"}, name,
		errors.New("ValidatingAdmissionPolicy 'freeze-vol-1' with binding 'freeze-vol-1' denied request: vol-1 is frozen"))
	var (
		refuse atomic.Bool
		mu     sync.Mutex
		times  []time.Time
	)
	refuse.Store(true)
	refused := func() []time.Time {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(times)
	}
	w := newFakeWorldWith(t, Config{Workers: 2, RetryIntervalStart: start, RetryIntervalMax: 8 * start}, func(w *fakeWorld) {
		w.client.PrependReactor("create", "volumeattachments", func(action clienttesting.Action) (bool, runtime.Object, error) {
			if action.(clienttesting.CreateActionImpl).GetObject().(*storagev1.VolumeAttachment).Name != name || !refuse.Load() {
				return false, nil, nil
			}
			mu.Lock()
			defer mu.Unlock()
			times = append(times, time.Now())
			return true, nil, refusal
		})
	}, managedNode("node-a"), pv, pvc, podUsing("app", "node-a", "vol-1"))

	w.eventually("five refused creates", func() bool { return len(refused()) >= 5 })
	refuse.Store(false)
	w.eventually("the VolumeAttachment created once allowed", func() bool { _, ok := w.va(name); return ok })
	w.settle()

	at := refused()
	want := `Warning FailedAttachVolume AttachVolume.Attach failed for volume "vol-1" : kubernetes.io/csi: attacher.Attach failed: ` + refusal.Error()
	events := w.recorded()
	if len(events) != len(at) || countPrefix(events, want) != len(at) {
		t.Errorf("events = %q, want %d times %q (one per refused create)", events, len(at), want)
	}
	got, err := testutil.GetCounterValuesFromGatherer(w.registry, CreateErrorsMetric, map[string]string{"driver": testDriver}, "reason")
	if err != nil {
		t.Fatal(err)
	}
	if got["Forbidden"] != float64(len(at)) || len(got) != 1 {
		t.Errorf("%s = %v, want Forbidden %d", CreateErrorsMetric, got, len(at))
	}
	// The backoff: a refused create is retried after the key's per-item
	// delay, which doubles. (The first retry may follow at once: the first
	// pass recorded "attaching", which wakes the volume's keys.)
	var gaps []time.Duration
	for i := 1; i < len(at); i++ {
		gaps = append(gaps, at[i].Sub(at[i-1]))
	}
	t.Logf("waits between refused creates: %v", gaps)
	short := 0
	for _, g := range gaps {
		if g < start/2 {
			short++
		}
	}
	if short > 1 || gaps[len(gaps)-1] < 2*start {
		t.Errorf("waits between refused creates %v: want at most one retry at once and the backoff grown to at least %v", gaps, 2*start)
	}
	for _, wr := range w.writes() {
		if strings.HasPrefix(wr, "create volumeattachments") && wr != "create volumeattachments "+name {
			t.Errorf("unexpected write %q", wr)
		}
	}
}
