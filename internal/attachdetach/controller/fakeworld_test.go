package controller

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/component-base/metrics"
	"k8s.io/klog/v2/ktesting"

	"github.com/latchcsi/latch/internal/kube/kubenames"
	"github.com/latchcsi/latch/internal/kube/kubetest"
	"github.com/latchcsi/latch/internal/testsupport"
)

// The controller against client-go's fake clientset: the informers, event
// handlers, queues and executor run for real; the tests play the
// csi-attacher (status.attached) and the kubelet (volumesInUse, Pod
// deletion) by writing to the object tracker directly, so the clientset's
// action log holds only the controller's own requests.

const (
	testDriver = "disk.csi.example.com"
	testNS     = "team-a"
)

var (
	vaResource   = storagev1.SchemeGroupVersion.WithResource("volumeattachments")
	nodeResource = v1.SchemeGroupVersion.WithResource("nodes")
	podResource  = v1.SchemeGroupVersion.WithResource("pods")
)

// upstreamVAName is kube-controller-manager's VolumeAttachment name,
// written out independently of internal/kube.
func upstreamVAName(handle, driver, node string) string {
	sum := sha256.Sum256([]byte(handle + driver + node))
	return "csi-" + hex.EncodeToString(sum[:])
}

func uniqueName(handle string) v1.UniqueVolumeName {
	return v1.UniqueVolumeName("kubernetes.io/csi/" + testDriver + "^" + handle)
}

func managedNode(name string) *v1.Node {
	return &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(name + "-uid"),
			Annotations: map[string]string{kubenames.ControllerManagedAttachAnnotation: "true"}},
		Status: v1.NodeStatus{Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}}},
	}
}

// boundClaim returns a PV (handle = name) bound to a PVC of the same name.
func boundClaim(name string, mode v1.PersistentVolumeAccessMode) (*v1.PersistentVolume, *v1.PersistentVolumeClaim) {
	pvcUID := types.UID(name + "-pvc-uid")
	size := v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")}
	pv := &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(name + "-pv-uid")},
		Spec: v1.PersistentVolumeSpec{
			AccessModes: []v1.PersistentVolumeAccessMode{mode}, Capacity: size,
			ClaimRef:               &v1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: testNS, Name: name, UID: pvcUID},
			PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: testDriver, VolumeHandle: name}},
		},
		Status: v1.PersistentVolumeStatus{Phase: v1.VolumeBound},
	}
	pvc := &v1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: name, UID: pvcUID},
		Spec: v1.PersistentVolumeClaimSpec{AccessModes: []v1.PersistentVolumeAccessMode{mode},
			Resources: v1.VolumeResourceRequirements{Requests: size}, VolumeName: name},
		Status: v1.PersistentVolumeClaimStatus{Phase: v1.ClaimBound},
	}
	return pv, pvc
}

func podUsing(name, node, claim string) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: name, UID: types.UID(name + "-uid"),
			CreationTimestamp: metav1.Now()},
		Spec: v1.PodSpec{
			NodeName:   node,
			Containers: []v1.Container{{Name: "app", Image: "app"}},
			Volumes: []v1.Volume{{Name: "data", VolumeSource: v1.VolumeSource{
				PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}},
		},
		Status: v1.PodStatus{Phase: v1.PodRunning},
	}
}

// fakeWorld is one controller on a fake clientset.
type fakeWorld struct {
	t        testing.TB
	ctx      context.Context
	client   *fake.Clientset
	tracker  *kubetest.VersionedTracker
	events   *record.FakeRecorder
	registry metrics.KubeRegistry
	c        *Controller
	factory  informers.SharedInformerFactory

	// missed counts, per object name, the watch events the controller's
	// informers are not to get.
	mu     sync.Mutex
	missed map[string]int
	// uids numbers the UIDs the fake API server gives created objects.
	uids atomic.Int64
}

func newFakeWorld(t testing.TB, cfg Config, objs ...runtime.Object) *fakeWorld {
	t.Helper()
	return newFakeWorldWith(t, cfg, nil, objs...)
}

// newFakeWorldWith is newFakeWorld with beforeStart called once the
// controller is built and before anything runs: the place to prepend
// reactors, wrap a store or mark watch events to be missed.
func newFakeWorldWith(t testing.TB, cfg Config, beforeStart func(*fakeWorld), objs ...runtime.Object) *fakeWorld {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	w := &fakeWorld{t: t, ctx: ctx, client: fake.NewClientset(), events: record.NewFakeRecorder(100), missed: map[string]int{}}
	// Route every request through a tracker that versions objects the way
	// the API server does; the clientset's own reactors would store them
	// without a resourceVersion.
	w.tracker = &kubetest.VersionedTracker{ObjectTracker: w.client.Tracker()}
	w.client.ReactionChain = nil
	w.client.AddReactor("*", "*", clienttesting.ObjectReaction(w.tracker))
	w.client.PrependReactor("create", "*", w.serverCreate)
	for _, obj := range objs {
		if err := w.tracker.Add(obj); err != nil {
			t.Fatal(err)
		}
	}
	watches := make(chan string, 20)
	w.client.PrependWatchReactor("*", func(action clienttesting.Action) (bool, watch.Interface, error) {
		var opts metav1.ListOptions
		if wa, ok := action.(clienttesting.WatchActionImpl); ok {
			opts = wa.ListOptions
		}
		inner, err := w.tracker.Watch(action.GetResource(), action.GetNamespace(), opts)
		if err != nil {
			return false, nil, err
		}
		watches <- action.GetResource().Resource
		return true, watch.Filter(inner, func(ev watch.Event) (watch.Event, bool) {
			m, ok := ev.Object.(metav1.Object)
			return ev, !ok || !w.dropped(m.GetName())
		}), nil
	})
	factory := informers.NewSharedInformerFactory(w.client, 0)
	m := NewMetrics()
	w.registry = metrics.NewKubeRegistry()
	m.Register(w.registry)
	c, err := New(ctx, cfg, w.client, factory, w.events, m)
	if err != nil {
		t.Fatal(err)
	}
	w.c, w.factory = c, factory
	if beforeStart != nil {
		beforeStart(w)
	}
	factory.Start(ctx.Done())
	// The tracker does not replay what happened between an informer's list
	// and its watch: start the workers only once every informer watches.
	for range 7 {
		select {
		case <-watches:
		case <-time.After(10 * time.Second):
			t.Fatal("informers did not start watching")
		}
	}
	// Tests write to the caches directly: the initial lists must be in
	// them first, or their processing would undo those writes.
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			t.Fatalf("cache of %v did not sync", typ)
		}
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		factory.Shutdown()
	})
	return w
}

// serverCreate stores the object of a create action the way the API
// server does, with a UID (the tracker leaves it empty, and the
// controller tells VolumeAttachments of one name apart by UID). Reactors
// of tests call it to let a create through.
func (w *fakeWorld) serverCreate(action clienttesting.Action) (bool, runtime.Object, error) {
	create, ok := action.(clienttesting.CreateActionImpl)
	if !ok {
		return false, nil, nil
	}
	obj := create.GetObject().DeepCopyObject()
	if m, err := meta.Accessor(obj); err == nil && m.GetUID() == "" {
		m.SetUID(types.UID(fmt.Sprintf("uid-%d", w.uids.Add(1))))
	}
	create.Object = obj
	return clienttesting.ObjectReaction(w.tracker)(create)
}

// vaCache is the controller's VolumeAttachment informer cache. Writing
// to it directly runs no event handler: with missNext, that is a missed
// event.
func (w *fakeWorld) vaCache() cache.Indexer {
	return w.factory.Storage().V1().VolumeAttachments().Informer().GetIndexer()
}

// missNext makes the controller's informers miss the next watch event
// about the object called name.
func (w *fakeWorld) missNext(name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.missed[name]++
}

// dropped reports whether the watch event about name is to be missed.
func (w *fakeWorld) dropped(name string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.missed[name] == 0 {
		return false
	}
	w.missed[name]--
	return true
}

// writes returns the controller's API writes so far, in order, as
// "verb resource[/subresource] name".
func (w *fakeWorld) writes() []string {
	var out []string
	for _, a := range w.client.Actions() {
		res := a.GetResource().Resource
		if a.GetSubresource() != "" {
			res += "/" + a.GetSubresource()
		}
		switch a := a.(type) {
		case clienttesting.CreateActionImpl:
			out = append(out, "create "+res+" "+a.GetObject().(metav1.Object).GetName())
		case clienttesting.UpdateActionImpl:
			out = append(out, "update "+res+" "+a.GetObject().(metav1.Object).GetName())
		case clienttesting.PatchActionImpl:
			out = append(out, "patch "+res+" "+a.GetName())
		case clienttesting.DeleteActionImpl:
			out = append(out, "delete "+res+" "+a.GetName())
		}
	}
	return out
}

// nodePatches returns the status.volumesAttached lists the controller's
// node status patches set, in order.
func (w *fakeWorld) nodePatches(node string) [][]v1.UniqueVolumeName {
	var out [][]v1.UniqueVolumeName
	for _, a := range w.client.Actions() {
		p, ok := a.(clienttesting.PatchActionImpl)
		if !ok || p.GetResource() != nodeResource || p.GetName() != node {
			continue
		}
		if p.GetSubresource() != "status" || p.GetPatchType() != types.MergePatchType {
			w.t.Errorf("node patch %s subresource %q type %s, want a merge patch of status", node, p.GetSubresource(), p.GetPatchType())
		}
		var n v1.Node
		if err := json.Unmarshal(p.GetPatch(), &n); err != nil {
			w.t.Fatalf("node patch %s: %v", p.GetPatch(), err)
		}
		names := []v1.UniqueVolumeName{}
		for _, av := range n.Status.VolumesAttached {
			names = append(names, av.Name)
		}
		out = append(out, names)
	}
	return out
}

func (w *fakeWorld) eventually(what string, cond func() bool) {
	w.t.Helper()
	testsupport.Eventually(w.t, w.ctx, 15*time.Second, what, func(context.Context) (bool, error) { return cond(), nil },
		func() { w.t.Logf("controller writes: %q", w.writes()) })
}

func (w *fakeWorld) waitWrites(n int) []string {
	w.t.Helper()
	w.eventually(fmt.Sprintf("%d controller writes", n), func() bool { return len(w.writes()) >= n })
	return w.writes()
}

func (w *fakeWorld) va(name string) (*storagev1.VolumeAttachment, bool) {
	obj, err := w.tracker.Get(vaResource, "", name)
	if err != nil {
		return nil, false
	}
	return obj.(*storagev1.VolumeAttachment), true
}

// attach plays csi-attacher: status.attached=true.
func (w *fakeWorld) attach(name string) {
	w.t.Helper()
	va, ok := w.va(name)
	if !ok {
		w.t.Fatalf("VolumeAttachment %s not found", name)
	}
	va.Status.Attached = true
	if err := w.tracker.Update(vaResource, va, "", metav1.UpdateOptions{FieldManager: "csi-attacher"}); err != nil {
		w.t.Fatal(err)
	}
}

// setInUse plays the kubelet: status.volumesInUse.
func (w *fakeWorld) setInUse(node string, vols ...v1.UniqueVolumeName) {
	w.t.Helper()
	obj, err := w.tracker.Get(nodeResource, "", node)
	if err != nil {
		w.t.Fatal(err)
	}
	n := obj.(*v1.Node)
	n.Status.VolumesInUse = vols
	if err := w.tracker.Update(nodeResource, n, "", metav1.UpdateOptions{FieldManager: "kubelet"}); err != nil {
		w.t.Fatal(err)
	}
}

// attachedInUse waits for the controller's create of the VolumeAttachment
// name (its first write), plays csi-attacher attaching it, waits for the
// node status write that follows, and plays node's kubelet mounting vol.
func (w *fakeWorld) attachedInUse(name, node string, vol v1.UniqueVolumeName) {
	w.t.Helper()
	w.waitWrites(1)
	w.attach(name)
	w.waitWrites(2)
	w.setInUseSeen(node, vol)
}

// attachConfirmed plays csi-attacher attaching the VolumeAttachment name
// the controller created on node, and checks what follows: one node
// status patch listing vol and SuccessfulAttachVolume for the Pod volume
// spec. Then node's kubelet mounts vol.
func (w *fakeWorld) attachConfirmed(name, node string, vol v1.UniqueVolumeName, spec string) {
	w.t.Helper()
	w.attach(name)
	w.waitWrites(2)
	if got := w.nodePatches(node); !slices.EqualFunc(got, [][]v1.UniqueVolumeName{{vol}}, slices.Equal) {
		w.t.Fatalf("node status patches = %v, want one listing %s", got, vol)
	}
	w.eventually("SuccessfulAttachVolume", func() bool { return len(w.events.Events) > 0 })
	want := `Normal SuccessfulAttachVolume AttachVolume.Attach succeeded for volume "` + spec + `" `
	if evs := w.recorded(); !slices.Equal(evs, []string{want}) {
		w.t.Errorf("events = %q, want %q", evs, want)
	}
	w.setInUseSeen(node, vol)
}

// vaGone removes the VolumeAttachment name from the API server, as
// csi-attacher does once it has let it go. missed: the controller's
// informer misses the deletion (a watch gap).
func (w *fakeWorld) vaGone(name string, missed bool) {
	w.t.Helper()
	if missed {
		w.missNext(name)
	}
	if err := w.tracker.Delete(vaResource, "", name); err != nil {
		w.t.Fatal(err)
	}
}

// finalizerHoldsDeleteOf makes the controller's deletes of the
// VolumeAttachment name find csi-attacher's finalizer: the object stays,
// being deleted, and the informer misses that update.
func (w *fakeWorld) finalizerHoldsDeleteOf(name string) {
	w.client.PrependReactor("delete", "volumeattachments", func(action clienttesting.Action) (bool, runtime.Object, error) {
		if action.(clienttesting.DeleteActionImpl).GetName() != name {
			return false, nil, nil
		}
		va, ok := w.va(name)
		if !ok {
			return false, nil, nil
		}
		va = va.DeepCopy()
		now := metav1.Now()
		va.DeletionTimestamp, va.Finalizers = &now, []string{"external-attacher/" + testDriver}
		w.missNext(name)
		return true, nil, w.tracker.Update(vaResource, va, "")
	})
}

// setInUseSeen is setInUse, then waits until the controller has handled
// the node update: the kubelet reports a volume in use before anything
// can make the controller want to detach it.
func (w *fakeWorld) setInUseSeen(node string, vols ...v1.UniqueVolumeName) {
	w.t.Helper()
	w.setInUse(node, vols...)
	w.eventually("node update in the controller's cache", func() bool {
		n, err := w.c.nodeLister.Get(node)
		return err == nil && slices.Equal(n.Status.VolumesInUse, vols)
	})
	w.settle()
}

func (w *fakeWorld) deletePod(name string) {
	w.t.Helper()
	if err := w.tracker.Delete(podResource, testNS, name); err != nil {
		w.t.Fatal(err)
	}
}

func (w *fakeWorld) addPod(p *v1.Pod) {
	w.t.Helper()
	if err := w.tracker.Create(podResource, p, testNS, metav1.CreateOptions{FieldManager: "scheduler"}); err != nil {
		w.t.Fatal(err)
	}
}

// recorded drains the events recorded so far.
func (w *fakeWorld) recorded() []string {
	var out []string
	for {
		select {
		case ev := <-w.events.Events:
			out = append(out, ev)
		default:
			return out
		}
	}
}

func countPrefix(list []string, prefix string) int {
	n := 0
	for _, s := range list {
		if strings.HasPrefix(s, prefix) {
			n++
		}
	}
	return n
}
