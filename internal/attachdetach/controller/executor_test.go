package controller

import (
	"maps"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/component-base/metrics/testutil"
	"k8s.io/utils/ptr"

	"github.com/latchcsi/latch/internal/attachdetach/state"
	"github.com/latchcsi/latch/internal/kube"
)

// noNewWrites fails if the controller writes anything within d beyond the
// n writes it has made.
func (w *fakeWorld) noNewWrites(n int, d time.Duration, why string) {
	w.t.Helper()
	time.Sleep(d)
	if got := w.writes(); len(got) != n {
		w.t.Fatalf("%s: controller writes = %q, want only the first %d", why, got, n)
	}
}

// gaugeSamples returns the samples of the gauge family name from the
// registry, each as its labels and value.
func (w *fakeWorld) gaugeSamples(name string) []gaugeSample {
	w.t.Helper()
	families, err := w.registry.Gather()
	if err != nil {
		w.t.Fatal(err)
	}
	var out []gaugeSample
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			out = append(out, gaugeSample{labels: labels, value: m.GetGauge().GetValue()})
		}
	}
	return out
}

type gaugeSample struct {
	labels map[string]string
	value  float64
}

// totalVolumes reads attachdetach_controller_total_volumes from the
// registry as "state" → count for the test driver's plugin.
func (w *fakeWorld) totalVolumes() map[string]float64 {
	w.t.Helper()
	out := map[string]float64{}
	for _, s := range w.gaugeSamples(TotalVolumesMetric) {
		if s.labels["plugin_name"] == "kubernetes.io/csi:"+testDriver {
			out[s.labels["state"]] = s.value
		}
	}
	return out
}

func (w *fakeWorld) histogramCount(name string, labels map[string]string) uint64 {
	w.t.Helper()
	h, err := testutil.GetHistogramVecFromGatherer(w.registry, name, labels)
	if err != nil {
		return 0
	}
	return h.GetAggregatedSampleCount()
}

func TestExecutor_podAttachesThenDetaches_exactOrderedWrites(t *testing.T) {
	pv, pvc := boundClaim("vol-1", v1.ReadWriteOnce)
	w := newFakeWorld(t, Config{Workers: 2}, managedNode("node-a"), pv, pvc, podUsing("app", "node-a", "vol-1"))
	name := upstreamVAName("vol-1", testDriver, "node-a")
	vol := uniqueName("vol-1")

	// Attach: the VolumeAttachment is created with the upstream name and
	// fields, by our field manager; nothing goes into the node status
	// before csi-attacher reports it attached.
	if got := w.waitWrites(1); !slices.Equal(got, []string{"create volumeattachments " + name}) {
		t.Fatalf("first write = %q, want the create of %s", got, name)
	}
	create := w.client.Actions()[slices.IndexFunc(w.client.Actions(), func(a clienttesting.Action) bool { return a.GetVerb() == "create" })].(clienttesting.CreateActionImpl)
	if create.CreateOptions.FieldManager != kube.AttachDetachFieldManager {
		t.Errorf("create field manager = %q, want %q", create.CreateOptions.FieldManager, kube.AttachDetachFieldManager)
	}
	va, ok := w.va(name)
	if !ok {
		t.Fatal("VolumeAttachment not stored")
	}
	wantSpec := storagev1.VolumeAttachmentSpec{Attacher: testDriver, NodeName: "node-a",
		Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: ptr.To("vol-1")}}
	if !apiequality.Semantic.DeepEqual(va.Spec, wantSpec) {
		t.Errorf("VolumeAttachment spec = %+v, want %+v", va.Spec, wantSpec)
	}
	w.noNewWrites(1, 300*time.Millisecond, "not attached yet")

	w.attachConfirmed(name, "node-a", vol, "vol-1")
	if got := w.totalVolumes(); got["desired_state_of_world"] != 1 || got["actual_state_of_world"] != 1 {
		t.Errorf("%s = %v, want 1 desired and 1 actual", TotalVolumesMetric, got)
	}
	if n := w.histogramCount(OperationDurationMetric, map[string]string{"operation": "attach", "driver": testDriver}); n != 1 {
		t.Errorf("%s{operation=attach} count = %d, want 1", OperationDurationMetric, n)
	}
	if n := w.histogramCount(PodVolumesAttachedMetric, nil); n != 1 {
		t.Errorf("%s count = %d, want 1", PodVolumesAttachedMetric, n)
	}

	// Detach: not while the node still uses the volume; then out of the
	// node status first, and only then the VolumeAttachment deleted (with
	// its UID as precondition).
	w.deletePod("app")
	w.noNewWrites(2, 300*time.Millisecond, "volume still in use")
	w.setInUse("node-a")
	got := w.waitWrites(4)
	want := []string{"create volumeattachments " + name, "patch nodes/status node-a", "patch nodes/status node-a", "delete volumeattachments " + name}
	if !slices.Equal(got, want) {
		t.Fatalf("controller writes:\n got %q\nwant %q", got, want)
	}
	if got := w.nodePatches("node-a"); !slices.EqualFunc(got, [][]v1.UniqueVolumeName{{vol}, {}}, slices.Equal) {
		t.Errorf("node status patches = %v, want [%s] then []", got, vol)
	}
	for _, a := range w.client.Actions() {
		if d, ok := a.(clienttesting.DeleteActionImpl); ok {
			if p := d.DeleteOptions.Preconditions; p == nil || p.UID == nil || *p.UID != va.UID {
				t.Errorf("delete preconditions = %+v, want uid %q", p, va.UID)
			}
		}
	}
	if _, ok := w.va(name); ok {
		t.Error("VolumeAttachment still stored")
	}

	// Nothing is left in memory of the key, and the metrics say so.
	w.eventually("name book emptied", func() bool { return w.c.names.Len() == 0 })
	if keys := w.c.asw.Keys(); len(keys) != 0 {
		t.Errorf("actual state keys after detach = %v", keys)
	}
	if got := w.totalVolumes(); got["desired_state_of_world"] != 0 || got["actual_state_of_world"] != 0 {
		t.Errorf("%s after detach = %v, want none", TotalVolumesMetric, got)
	}
	if n := w.histogramCount(OperationDurationMetric, map[string]string{"operation": "detach", "driver": testDriver}); n != 1 {
		t.Errorf("%s{operation=detach} count = %d, want 1", OperationDurationMetric, n)
	}
	w.noNewWrites(4, 200*time.Millisecond, "after detach")
}

// rwoInUseOnNodeA starts a controller with two managed nodes and the Pod
// "first" on node-a using the ReadWriteOnce volume vol-1, and brings vol-1
// to attached and in use there. It returns the names of vol-1's
// VolumeAttachments on both nodes.
func rwoInUseOnNodeA(t *testing.T) (w *fakeWorld, nameA, nameB string, vol v1.UniqueVolumeName) {
	t.Helper()
	pv, pvc := boundClaim("vol-1", v1.ReadWriteOnce)
	w = newFakeWorld(t, Config{Workers: 2}, managedNode("node-a"), managedNode("node-b"), pv, pvc, podUsing("first", "node-a", "vol-1"))
	nameA, nameB = upstreamVAName("vol-1", testDriver, "node-a"), upstreamVAName("vol-1", testDriver, "node-b")
	vol = uniqueName("vol-1")
	w.attachedInUse(nameA, "node-a", vol)
	return w, nameA, nameB, vol
}

func TestExecutor_multiAttachConflict_oneEventThenAttachAfterRelease(t *testing.T) {
	w, nameA, nameB, vol := rwoInUseOnNodeA(t)
	w.eventually("SuccessfulAttachVolume", func() bool { return len(w.events.Events) > 0 })
	w.recorded()

	w.addPod(podUsing("second", "node-b", "vol-1"))
	conflict := `Warning FailedAttachVolume Multi-Attach error for volume "vol-1" Volume is already used by pod(s) first`
	w.eventually("the Multi-Attach warning", func() bool { return len(w.events.Events) > 0 })
	// The key is decided again and again (every change of the volume on
	// either node does that); the warning is not repeated.
	for range 5 {
		w.c.wake.Volumes(w.c.asw.Keys())
		time.Sleep(20 * time.Millisecond)
	}
	w.noNewWrites(2, 300*time.Millisecond, "conflict")
	if evs := w.recorded(); !slices.Equal(evs, []string{conflict}) {
		t.Fatalf("events during the conflict = %q, want exactly one %q", evs, conflict)
	}
	if got := w.waitingForMultiAttach(); !maps.Equal(got, map[string]float64{testDriver: 1}) {
		t.Errorf("%s during the conflict = %v, want 1 for %s", MultiAttachWaitingMetric, got, testDriver)
	}

	w.deletePod("first")
	w.setInUse("node-a")
	got := w.waitWrites(5)
	want := []string{"create volumeattachments " + nameA, "patch nodes/status node-a", "patch nodes/status node-a",
		"delete volumeattachments " + nameA, "create volumeattachments " + nameB}
	if !slices.Equal(got, want) {
		t.Fatalf("controller writes:\n got %q\nwant %q", got, want)
	}
	w.attach(nameB)
	w.waitWrites(6)
	if got := w.nodePatches("node-b"); !slices.EqualFunc(got, [][]v1.UniqueVolumeName{{vol}}, slices.Equal) {
		t.Errorf("node-b status patches = %v, want one listing %s", got, vol)
	}
	w.eventually("SuccessfulAttachVolume on the second pod", func() bool { return len(w.events.Events) > 0 })
	evs := w.recorded()
	if countPrefix(evs, "Warning") != 0 || !slices.Equal(evs, []string{`Normal SuccessfulAttachVolume AttachVolume.Attach succeeded for volume "vol-1" `}) {
		t.Errorf("events after the release = %q, want only SuccessfulAttachVolume", evs)
	}
	w.eventually("name book holds only node-b's name", func() bool { return w.c.names.Len() == 1 })
	if key, ok := w.c.names.Get(nameB); !ok || key.Node != "node-b" {
		t.Errorf("name book entry of %s = %v, %v", nameB, key, ok)
	}
	if got := w.waitingForMultiAttach(); len(got) != 0 {
		t.Errorf("%s after the release = %v, want none", MultiAttachWaitingMetric, got)
	}
}

// waitingForMultiAttach is the Multi-Attach waiting gauge by driver
// (zero values left out).
func (w *fakeWorld) waitingForMultiAttach() map[string]float64 {
	w.t.Helper()
	out := map[string]float64{}
	for _, s := range w.gaugeSamples(MultiAttachWaitingMetric) {
		if d, ok := s.labels["driver"]; ok && s.value != 0 {
			out[d] = s.value
		}
	}
	return out
}

// driftWorld attaches vol-1 to node-a and returns the world and the
// VolumeAttachment name, for the verify pass tests.
func driftWorld(t *testing.T, verify time.Duration) (*fakeWorld, string) {
	pv, pvc := boundClaim("vol-1", v1.ReadWriteOnce)
	w := newFakeWorld(t, Config{Workers: 2, VerifyPeriod: verify}, managedNode("node-a"), pv, pvc, podUsing("app", "node-a", "vol-1"))
	name := upstreamVAName("vol-1", testDriver, "node-a")
	w.attachedInUse(name, "node-a", uniqueName("vol-1"))
	return w, name
}

// settle waits until every queue has been empty for a while: the events
// of the test's last writes have been handled.
func (w *fakeWorld) settle() {
	w.t.Helper()
	quiet := 0
	w.eventually("queues drained", func() bool {
		c := w.c
		if c.wake.backlog() == 0 {
			quiet++
		} else {
			quiet = 0
		}
		return quiet >= 20
	})
}

// deleteBehindTheController deletes the VolumeAttachment as another
// client would, and makes the controller's informer cache agree without
// its delete handler running (the event was missed).
func (w *fakeWorld) deleteBehindTheController(name string) {
	w.t.Helper()
	va, ok := w.va(name)
	if !ok {
		w.t.Fatalf("VolumeAttachment %s not found", name)
	}
	w.vaGone(name, true)
	if err := w.vaCache().Delete(va); err != nil {
		w.t.Fatal(err)
	}
}

func TestVerify_wantedVolumeAttachmentDeletedBehindTheController_recreated(t *testing.T) {
	w, name := driftWorld(t, 100*time.Millisecond)
	w.deleteBehindTheController(name)

	// The verify pass finds the attached entry without a VolumeAttachment:
	// the volume leaves the node status and the VolumeAttachment is
	// created again (the two writes run on separate queues).
	got := w.waitWrites(4)
	tail := slices.Clone(got[2:])
	slices.Sort(tail)
	if want := []string{"create volumeattachments " + name, "patch nodes/status node-a"}; !slices.Equal(tail, want) {
		t.Fatalf("writes after the drift = %q, want %q", got[2:], want)
	}
	if patches := w.nodePatches("node-a"); len(patches) != 2 || len(patches[1]) != 0 {
		t.Fatalf("node status patches = %v, want the volume listed, then removed", patches)
	}
	// Attached again → listed again.
	w.attach(name)
	w.waitWrites(5)
	if patches := w.nodePatches("node-a"); len(patches) != 3 || !slices.Equal(patches[2], []v1.UniqueVolumeName{uniqueName("vol-1")}) {
		t.Errorf("node status patches = %v, want the volume listed again", patches)
	}
}

func TestVerify_disabled_missedDeleteGoesUnnoticed(t *testing.T) {
	// The control for the test above: without the verify pass the same
	// missed event leaves the drift in place, so it is the verify pass
	// that repairs it there.
	w, name := driftWorld(t, 0)
	w.deleteBehindTheController(name)
	w.noNewWrites(2, 500*time.Millisecond, "verify pass disabled")
}

func TestVerify_unknownVolumeAttachmentNothingWants_deleted(t *testing.T) {
	pv, pvc := boundClaim("vol-2", v1.ReadWriteOnce)
	w := newFakeWorld(t, Config{Workers: 2, VerifyPeriod: 100 * time.Millisecond}, managedNode("node-a"), pv, pvc)
	name := upstreamVAName("vol-2", testDriver, "node-a")
	va := &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: "stray-uid"},
		Spec: storagev1.VolumeAttachmentSpec{Attacher: testDriver, NodeName: "node-a",
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: ptr.To("vol-2")}},
		Status: storagev1.VolumeAttachmentStatus{Attached: true},
	}
	// Created by another client; the controller's informer stored it but
	// its add handler never ran.
	w.missNext(name)
	if err := w.tracker.Create(vaResource, va, "", metav1.CreateOptions{FieldManager: "someone"}); err != nil {
		t.Fatal(err)
	}
	if err := w.vaCache().Add(va); err != nil {
		t.Fatal(err)
	}

	// Never listed in the node status, not in use, wanted by nobody:
	// deleted without a node status write.
	if got := w.waitWrites(1); !slices.Equal(got, []string{"delete volumeattachments " + name}) {
		t.Fatalf("controller writes = %q, want only the delete of %s", got, name)
	}
	if _, ok := w.va(name); ok {
		t.Error("stray VolumeAttachment still stored")
	}
	w.eventually("name book emptied", func() bool { return w.c.names.Len() == 0 })
}

func TestNodeStatus_informerNotShowingOurWriteYet_noRepeatedWrite(t *testing.T) {
	pv, pvc := boundClaim("vol-1", v1.ReadWriteOnce)
	w := newFakeWorld(t, Config{Workers: 2}, managedNode("node-a"), pv, pvc, podUsing("app", "node-a", "vol-1"))
	name := upstreamVAName("vol-1", testDriver, "node-a")
	w.waitWrites(1)
	w.settle()
	// The informer never shows the node status write that follows.
	w.missNext("node-a")
	w.attach(name)
	w.waitWrites(2)
	w.settle()
	if n, _ := w.c.nodeLister.Get("node-a"); len(n.Status.VolumesAttached) != 0 {
		t.Fatalf("the informer shows the write: %v", n.Status.VolumesAttached)
	}
	// Every pass now compares the same wanted list with a stale informer
	// copy; the server already holds that list.
	for range 3 {
		w.c.wake.NodeStatus("node-a")
		w.settle()
	}
	if got := w.nodePatches("node-a"); len(got) != 1 {
		t.Errorf("node status patches = %v, want the one write", got)
	}
}

func TestExecutor_ownDeleteNotYetInTheInformer_exclusiveVolumeStillBlocksTheOtherNode(t *testing.T) {
	w, nameA, nameB, vol := rwoInUseOnNodeA(t)
	w.addPod(podUsing("second", "node-b", "vol-1"))
	w.settle()

	// The controller deletes node-a's VolumeAttachment; its informer does
	// not show the deletion yet (csi-attacher may still be unpublishing).
	vaA, _ := w.va(nameA)
	w.missNext(nameA)
	w.deletePod("first")
	w.setInUse("node-a")
	got := w.waitWrites(4)
	if got[3] != "delete volumeattachments "+nameA {
		t.Fatalf("controller writes = %q, want node-a's VolumeAttachment deleted", got)
	}
	w.settle()
	// Any change of the volume decides both nodes again; the deleted
	// VolumeAttachment must still count as there, being deleted.
	for range 3 {
		w.c.wake.Volumes([]state.Key{{Volume: vol, Node: "node-a"}})
		w.settle()
	}
	w.noNewWrites(4, 100*time.Millisecond, "node-a's detach not confirmed yet")

	// The informer catches up: now node-b gets the volume.
	if err := w.vaCache().Delete(vaA); err != nil {
		t.Fatal(err)
	}
	w.c.vaDeleted(vaA)
	if got := w.waitWrites(5); got[4] != "create volumeattachments "+nameB {
		t.Fatalf("controller writes = %q, want node-b's VolumeAttachment created last", got)
	}
}
