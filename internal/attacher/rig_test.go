package attacher

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/kubernetes/scheme"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"

	"github.com/latchcsi/latch/internal/csi"
	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/kube/kubenames"
	"github.com/latchcsi/latch/internal/kube/kubetest"
	"github.com/latchcsi/latch/internal/testsupport"
)

// The unit rig of package attacher: the Controller's passes run against a
// fake clientset whose informers are fed from the same fake (so they see
// our own writes, late, as a real watch would) and the mock CSI driver
// over a unix socket. Tests assert the exact ordered API writes and CSI
// calls of one pass.

const execDriver = "executor.csi.latch.dev"

var (
	vaGVR = schema.GroupVersionResource{Group: "storage.k8s.io", Version: "v1", Resource: "volumeattachments"}
	pvGVR = schema.GroupVersionResource{Version: "v1", Resource: "persistentvolumes"}
)

type execFixture struct {
	t        *testing.T
	ctx      context.Context
	client   *fake.Clientset
	tracker  *kubetest.VersionedTracker
	ctrl     *Controller
	driver   *csimock.Driver
	recorder *record.FakeRecorder
	// The informers' raw stores, for tests that wait for the cache.
	vaStore, pvStore cache.Store
}

func newExecFixture(t *testing.T, objs ...runtime.Object) *execFixture {
	t.Helper()
	return newExecFixtureWith(t, fixtureHooks{}, objs...)
}

// fixtureHooks change a fixture before its informers start: config edits
// the Controller's Config, setup the Controller.
type fixtureHooks struct {
	config func(*Config)
	setup  func(*Controller)
}

// newExecFixtureWith is newExecFixture with hooks.
func newExecFixtureWith(t *testing.T, hooks fixtureHooks, objs ...runtime.Object) *execFixture {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	t.Cleanup(cancel)

	cfg := csimock.DefaultConfig()
	cfg.Name = execDriver
	cfg.NodeService = false
	cfg.AutoCreateVolumes = true
	driver, err := csimock.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "x")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	socket := filepath.Join(dir, "csi.sock")
	if err := driver.Start(ctx, socket); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(driver.Stop)
	csiClient, err := csi.Connect(ctx, csi.Options{Address: socket, ConnectTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { csiClient.Close() })

	client, tracker, watches := newWatchedRVClientset()
	for _, o := range objs {
		if err := tracker.Add(o); err != nil {
			t.Fatal(err)
		}
	}
	factory := NewInformers(client, 0, execDriver)
	recorder := record.NewFakeRecorder(100)
	ctrlCfg := Config{
		Driver:  DriverInfo{Name: execDriver, SupportsReadOnly: true, SupportsSingleNodeMultiWriter: true, DefaultFSType: "ext4"},
		Workers: 1, Timeout: 5 * time.Second, RetryIntervalStart: time.Hour, RetryIntervalMax: time.Hour,
	}
	if hooks.config != nil {
		hooks.config(&ctrlCfg)
	}
	ctrl, err := New(ctrlCfg, client, factory, csiClient, recorder, nil)
	if err != nil {
		t.Fatal(err)
	}
	if hooks.setup != nil {
		hooks.setup(ctrl)
	}
	factory.Start(ctx.Done())
	t.Cleanup(func() {
		cancel()
		factory.Shutdown()
	})
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			t.Fatalf("cache of %v did not sync", typ)
		}
	}
	// Tests delete objects in the tracker and wait for the informers to
	// see it: only after their watches run.
	for _, resource := range []string{"volumeattachments", "persistentvolumes"} {
		select {
		case <-watches.watching(resource):
		case <-ctx.Done():
			t.Fatalf("no informer watches %s", resource)
		}
	}
	client.ClearActions()
	return &execFixture{t: t, ctx: ctx, client: client, tracker: tracker, ctrl: ctrl, driver: driver, recorder: recorder,
		vaStore: factory.ByKind()["VA"].GetStore(), pvStore: factory.ByKind()["PV"].GetStore()}
}

// newWatchedRVClientset is fake.NewSimpleClientset over a
// VersionedTracker, and says when each resource's watch started.
func newWatchedRVClientset() (*fake.Clientset, *kubetest.VersionedTracker, *watchLog) {
	watches := &watchLog{}
	tracker := &kubetest.VersionedTracker{ObjectTracker: clienttesting.NewObjectTracker(scheme.Scheme, scheme.Codecs.UniversalDecoder())}
	cs := &fake.Clientset{}
	cs.AddReactor("*", "*", clienttesting.ObjectReaction(tracker))
	cs.AddWatchReactor("*", func(action clienttesting.Action) (bool, watch.Interface, error) {
		var opts metav1.ListOptions
		if w, ok := action.(clienttesting.WatchActionImpl); ok {
			opts = w.ListOptions
		}
		w, err := tracker.Watch(action.GetResource(), action.GetNamespace(), opts)
		if err != nil {
			return false, nil, err
		}
		watches.record(action.GetResource().Resource)
		return true, w, nil
	})
	return cs, tracker, watches
}

// watchLog records which resources a fake clientset's informers watch, so
// a fixture can wait until an informer's watch runs: a synced cache only
// says its List returned, and an object the test deletes before the Watch
// starts would never leave the cache.
type watchLog struct {
	mu      sync.Mutex
	started map[string]chan struct{}
}

func (l *watchLog) ch(resource string) chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.started == nil {
		l.started = map[string]chan struct{}{}
	}
	ch, ok := l.started[resource]
	if !ok {
		ch = make(chan struct{})
		l.started[resource] = ch
	}
	return ch
}

func (l *watchLog) record(resource string) {
	ch := l.ch(resource)
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-ch:
	default:
		close(ch)
	}
}

// watching is closed once an informer watches resource.
func (l *watchLog) watching(resource string) <-chan struct{} { return l.ch(resource) }

// apiWrite is one mutating API call the controller made.
type apiWrite struct {
	Verb, Resource, Subresource, Name string
	PatchType                         types.PatchType
	Patch                             string
}

func (w apiWrite) String() string {
	s := w.Verb + " " + w.Resource
	if w.Subresource != "" {
		s += "/" + w.Subresource
	}
	return s + " " + w.Name
}

// writes returns the mutating calls made since the last ClearActions.
func (f *execFixture) writes() []apiWrite {
	var out []apiWrite
	for _, a := range f.client.Actions() {
		switch a.GetVerb() {
		case "get", "list", "watch":
			continue
		}
		w := apiWrite{Verb: a.GetVerb(), Resource: a.GetResource().Resource, Subresource: a.GetSubresource()}
		switch a := a.(type) {
		case clienttesting.PatchAction:
			w.Name, w.PatchType, w.Patch = a.GetName(), a.GetPatchType(), string(a.GetPatch())
		case clienttesting.DeleteAction:
			w.Name = a.GetName()
		}
		out = append(out, w)
	}
	return out
}

// requireWrites checks the verbs/resources/names of the writes, in order.
func (f *execFixture) requireWrites(want ...string) []apiWrite {
	f.t.Helper()
	got := f.writes()
	var names []string
	for _, w := range got {
		names = append(names, w.String())
	}
	if !slices.Equal(names, want) {
		f.t.Fatalf("API writes:\n  got  %q\n  want %q", names, want)
	}
	return got
}

// csiCalls lists the driver's calls as "Method volume node code".
func (f *execFixture) csiCalls() []string {
	var out []string
	for _, c := range f.driver.Calls() {
		switch c.Method {
		case "ControllerPublishVolume", "ControllerUnpublishVolume":
			out = append(out, c.Method+" "+c.VolumeID+" "+c.NodeID+" "+c.Code.String())
		}
	}
	return out
}

func (f *execFixture) requireCSICalls(want ...string) {
	f.t.Helper()
	if got := f.csiCalls(); !slices.Equal(got, want) {
		f.t.Fatalf("CSI calls:\n  got  %q\n  want %q", got, want)
	}
}

func (f *execFixture) va(name string) *storagev1.VolumeAttachment {
	f.t.Helper()
	return tracked[*storagev1.VolumeAttachment](f, vaGVR, "VolumeAttachment", name)
}

func (f *execFixture) pv(name string) *v1.PersistentVolume {
	f.t.Helper()
	return tracked[*v1.PersistentVolume](f, pvGVR, "PersistentVolume", name)
}

// tracked is the object the fake API server holds under name.
func tracked[T any](f *execFixture, gvr schema.GroupVersionResource, kind, name string) T {
	f.t.Helper()
	obj, err := f.tracker.Get(gvr, "", name)
	if err != nil {
		f.t.Fatalf("get %s %s: %v", kind, name, err)
	}
	return obj.(T)
}

// updateVA replaces a VA in the tracker (not through the client, so it
// is not counted as a write) and waits until the controller's cache has it.
func (f *execFixture) updateVA(va *storagev1.VolumeAttachment) {
	f.t.Helper()
	if err := f.tracker.Update(vaGVR, va, ""); err != nil {
		f.t.Fatal(err)
	}
	rv := f.va(va.Name).ResourceVersion
	f.waitFor("VA "+va.Name+" in cache", func() bool {
		cached, err := LookupVA(f.vaStore, va.Name)
		return err == nil && cached != nil && cached.ResourceVersion == rv
	})
}

// waitFor is the unit rig's Eventually: the project's one
// (testsupport.Eventually, which the end-to-end rig uses too).
func (f *execFixture) waitFor(what string, cond func() bool) {
	f.t.Helper()
	testsupport.Eventually(f.t, f.ctx, 10*time.Second, what, func(context.Context) (bool, error) { return cond(), nil })
}

func execPV(name string) *v1.PersistentVolume {
	return &v1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name)},
		Spec: v1.PersistentVolumeSpec{
			AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
			PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{
				Driver: execDriver, VolumeHandle: "handle-" + name,
			}},
		},
	}
}

func execVA(name, pv string) *storagev1.VolumeAttachment {
	return &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name)},
		Spec: storagev1.VolumeAttachmentSpec{
			Attacher: execDriver, NodeName: "node-1",
			Source: storagev1.VolumeAttachmentSource{PersistentVolumeName: &pv},
		},
	}
}

func execCSINode() *storagev1.CSINode {
	return &storagev1.CSINode{
		ObjectMeta: metav1.ObjectMeta{Name: "node-1"},
		Spec:       storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{Name: execDriver, NodeID: "node-1-id"}}},
	}
}

// attachedVA is a VA as a successful attach leaves it.
func attachedVA(name, pv string, finalizers ...string) *storagev1.VolumeAttachment {
	va := execVA(name, pv)
	va.Finalizers = append([]string{kubenames.AttacherFinalizer(execDriver)}, finalizers...)
	va.Annotations = map[string]string{kubenames.VANodeIDAnnotation: "node-1-id", AnnVolumeHandle: "handle-" + pv}
	va.Status = storagev1.VolumeAttachmentStatus{Attached: true, AttachmentMetadata: map[string]string{"device": "/dev/x"}}
	return va
}

func deleting[T metav1.Object](obj T) T {
	now := metav1.Now()
	obj.SetDeletionTimestamp(&now)
	return obj
}

// jsonOf decodes a patch for comparison with an expected structure.
func jsonOf(t *testing.T, s string) any {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("patch %s is not JSON: %v", s, err)
	}
	return v
}

func requirePatch(t *testing.T, w apiWrite, typ types.PatchType, want string) {
	t.Helper()
	if w.PatchType != typ {
		t.Errorf("%s: patch type %s, want %s", w, w.PatchType, typ)
	}
	if got, exp := jsonOf(t, w.Patch), jsonOf(t, want); !reflect.DeepEqual(got, exp) {
		t.Errorf("%s: patch\n  got  %s\n  want %s", w, w.Patch, want)
	}
}

// deleteOnStatusPatch makes the first status write of va delete it and
// answer NotFound, as for a VolumeAttachment force-deleted during the call.
func deleteOnStatusPatch(f *execFixture, va string) {
	f.client.PrependReactor("patch", "volumeattachments", func(action clienttesting.Action) (bool, runtime.Object, error) {
		if action.GetSubresource() != "status" {
			return false, nil, nil
		}
		if err := f.tracker.Delete(vaGVR, "", va); err != nil {
			return true, nil, err
		}
		return true, nil, apierrors.NewNotFound(vaGVR.GroupResource(), va)
	})
}

func drainEvents(r *record.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-r.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}
