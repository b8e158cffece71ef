package localcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/testsupport"
)

func startKubelet(t *testing.T, ctx context.Context) (*Kubelet, kubernetes.Interface) {
	t.Helper()
	client := shared.Client()
	k := NewKubelet(client)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { k.Run(runCtx, 2); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return k, client
}

func eventually(t *testing.T, ctx context.Context, what string, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	testsupport.Eventually(t, ctx, 30*time.Second, what, cond)
}

func setVolumesAttached(t *testing.T, ctx context.Context, client kubernetes.Interface, node string, names ...v1.UniqueVolumeName) {
	t.Helper()
	list := []v1.AttachedVolume{}
	for _, n := range names {
		list = append(list, v1.AttachedVolume{Name: n, DevicePath: ""})
	}
	patch, _ := json.Marshal(map[string]any{"status": map[string]any{"volumesAttached": list}})
	if _, err := client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		t.Fatalf("set volumesAttached on %s: %v", node, err)
	}
}

func TestKubeletRegistersManagedReadyNodeAndCSINode(t *testing.T) {
	ctx := testContext(t)
	k, client := startKubelet(t, ctx)
	name := runName(t, "reg-node")
	if err := k.AddNode(ctx, NodeConfig{Name: name, Drivers: map[string]string{"b.csi.test": "b-id", "a.csi.test": "a-id"}}); err != nil {
		t.Fatal(err)
	}
	node, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := node.Annotations[ControllerManagedAnnotation]; !ok {
		t.Errorf("node annotations = %v, want %s", node.Annotations, ControllerManagedAnnotation)
	}
	if !kube.NodeReady(node) {
		t.Errorf("node conditions = %v, want Ready=True", node.Status.Conditions)
	}
	csiNode, err := client.StorageV1().CSINodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range csiNode.Spec.Drivers {
		got = append(got, d.Name+"="+d.NodeID)
	}
	if want := []string{"a.csi.test=a-id", "b.csi.test=b-id"}; !slices.Equal(got, want) {
		t.Errorf("CSINode drivers = %v, want %v", got, want)
	}

	if err := k.SetReady(ctx, name, false); err != nil {
		t.Fatal(err)
	}
	if node, _ := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{}); kube.NodeReady(node) {
		t.Errorf("node still Ready after SetReady(false)")
	}
	taint := v1.Taint{Key: OutOfServiceTaint, Value: "nodeshutdown", Effect: v1.TaintEffectNoExecute}
	if err := k.Taint(ctx, name, taint); err != nil {
		t.Fatal(err)
	}
	if node, _ := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{}); !slices.ContainsFunc(node.Spec.Taints, func(t v1.Taint) bool { return t.Key == OutOfServiceTaint }) {
		t.Errorf("taints = %v, want %s", node.Spec.Taints, OutOfServiceTaint)
	}
	if err := k.DeleteNode(ctx, name); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("node after DeleteNode: err = %v, want NotFound", err)
	}
	if _, err := client.StorageV1().CSINodes().Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("CSINode after DeleteNode: err = %v, want NotFound", err)
	}
}

// podScene is one test's namespace and node on a running kubelet
// stand-in, where the test's Pod is called "app".
type podScene struct {
	t        *testing.T
	ctx      context.Context
	k        *Kubelet
	client   kubernetes.Interface
	ns, node string
}

// runs numbers each test's runs in this process (go test -count=N), so
// that a repeated run names its objects apart: the tests share one API
// server, where namespaces and cluster-scoped objects outlive a test.
var runs = struct {
	sync.Mutex
	byName map[string]int
	byTest map[*testing.T]int
}{byName: map[string]int{}, byTest: map[*testing.T]int{}}

// runNumber is which run of the test this is in the process: 1, then 2
// and on under go test -count.
func runNumber(t *testing.T) int {
	runs.Lock()
	defer runs.Unlock()
	n, ok := runs.byTest[t]
	if !ok {
		runs.byName[t.Name()]++
		n = runs.byName[t.Name()]
		runs.byTest[t] = n
	}
	return n
}

// runName is name on the test's first run and "name-N" on its Nth.
func runName(t *testing.T, name string) string {
	if n := runNumber(t); n > 1 {
		return fmt.Sprintf("%s-%d", name, n)
	}
	return name
}

func newPodScene(t *testing.T, ns, node string, drivers map[string]string) *podScene {
	t.Helper()
	ns, node = runName(t, ns), runName(t, node)
	ctx := testContext(t)
	k, client := startKubelet(t, ctx)
	if err := CreateNamespace(ctx, client, ns); err != nil {
		t.Fatal(err)
	}
	if err := k.AddNode(ctx, NodeConfig{Name: node, Drivers: drivers}); err != nil {
		t.Fatal(err)
	}
	return &podScene{t: t, ctx: ctx, k: k, client: client, ns: ns, node: node}
}

// boundVolume creates a PV and its bound claim, both named pv (the PV
// with runName's suffix), and returns the claim's name.
func (s *podScene) boundVolume(driver, pv string) string {
	s.t.Helper()
	pv = runName(s.t, pv)
	if _, _, err := CreateBoundVolume(s.ctx, s.client, VolumeSpec{Namespace: s.ns, Name: pv, Driver: driver}); err != nil {
		s.t.Fatal(err)
	}
	return pv
}

func (s *podScene) createPod(pod *v1.Pod) {
	s.t.Helper()
	if _, err := s.client.CoreV1().Pods(s.ns).Create(s.ctx, pod, metav1.CreateOptions{}); err != nil {
		s.t.Fatal(err)
	}
}

func (s *podScene) waitRunning(what string) {
	s.t.Helper()
	eventually(s.t, s.ctx, what, func(ctx context.Context) (bool, error) {
		pod, err := s.client.CoreV1().Pods(s.ns).Get(ctx, "app", metav1.GetOptions{})
		return err == nil && pod.Status.Phase == v1.PodRunning, nil
	})
}

// stillNotRunning lets a pass of the node run and fails if the Pod is
// Running after it: it must still wait for why.
func (s *podScene) stillNotRunning(why string) {
	s.t.Helper()
	s.k.queue.Add(s.node)
	time.Sleep(200 * time.Millisecond) // let a pass run; nothing may change
	pod, err := s.client.CoreV1().Pods(s.ns).Get(s.ctx, "app", metav1.GetOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	if pod.Status.Phase == v1.PodRunning {
		s.t.Fatalf("pod %s/app is Running, want it waiting for %s", s.ns, why)
	}
}

func (s *podScene) volumesInUse() []v1.UniqueVolumeName {
	s.t.Helper()
	n, err := s.client.CoreV1().Nodes().Get(s.ctx, s.node, metav1.GetOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	return n.Status.VolumesInUse
}

func TestKubeletStartsPodOnlyAfterAttachAndReleasesVolumeOnDelete(t *testing.T) {
	const driver = "attach.csi.test"
	s := newPodScene(t, "kubelet-attach", "attach-node", map[string]string{driver: "n1"})
	pv := s.boundVolume(driver, "pv-attach")
	s.createPod(NewPod(s.ns, "app", s.node, pv))
	unique := UniqueVolumeName(driver, pv)

	// Unrelated node status churn makes the stand-in re-sync the node; the
	// Pod must still wait for its own volume.
	setVolumesAttached(t, s.ctx, s.client, s.node, UniqueVolumeName(driver, "someone-else"))
	eventually(t, s.ctx, "node synced with the unrelated volume", func(ctx context.Context) (bool, error) {
		n, err := s.k.nodes.Get(s.node)
		return err == nil && len(n.Status.VolumesAttached) == 1, nil
	})
	s.stillNotRunning("its volume to be attached")
	if inUse := s.volumesInUse(); len(inUse) != 0 {
		t.Fatalf("volumesInUse = %v before attach, want empty", inUse)
	}

	setVolumesAttached(t, s.ctx, s.client, s.node, unique)
	s.waitRunning("pod Running after attach")
	if inUse := s.volumesInUse(); !slices.Equal(inUse, []v1.UniqueVolumeName{unique}) {
		t.Fatalf("volumesInUse = %v, want [%s]", inUse, unique)
	}

	// Graceful delete: the stand-in releases the volume, then removes the Pod.
	if err := s.client.CoreV1().Pods(s.ns).Delete(s.ctx, "app", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, s.ctx, "pod gone after delete", func(ctx context.Context) (bool, error) {
		_, err := s.client.CoreV1().Pods(s.ns).Get(ctx, "app", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if inUse := s.volumesInUse(); len(inUse) != 0 {
		t.Fatalf("volumesInUse = %v after the pod is gone, want empty", inUse)
	}
}

func TestKubeletSkipsVolumesThatNeedNoAttach(t *testing.T) {
	const driver = "noattach.csi.test"
	s := newPodScene(t, "kubelet-noattach", "noattach-node", map[string]string{driver: "n1"})
	// A repeated run finds the CSIDriver its first run created.
	if _, err := s.client.StorageV1().CSIDrivers().Create(s.ctx, NewCSIDriver(driver, new(bool)), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	pv := s.boundVolume(driver, "pv-noattach")
	s.createPod(NewPod(s.ns, "app", s.node, pv))
	s.waitRunning("pod Running without any attach")
}

func TestKubeletKeepsPodWithUnboundClaimPending(t *testing.T) {
	s := newPodScene(t, "kubelet-unbound", "unbound-node", nil)
	s.createPod(NewPod(s.ns, "app", s.node, "missing-claim"))
	eventually(t, s.ctx, "pod seen by the stand-in", func(ctx context.Context) (bool, error) {
		objs, _ := s.k.pods.GetIndexer().ByIndex(podNodeIndex, s.node)
		return len(objs) == 1, nil
	})
	s.stillNotRunning("its missing PVC")
}

func TestKubeletWaitsForTheCSITranslationOfAMigratedInlineVolume(t *testing.T) {
	s := newPodScene(t, "kubelet-inline-gce", "inline-gce-node", map[string]string{"pd.csi.storage.gke.io": "n1"})
	pod := NewPod(s.ns, "app", s.node)
	pod.Spec.Volumes = append(pod.Spec.Volumes, v1.Volume{Name: "disk", VolumeSource: v1.VolumeSource{
		GCEPersistentDisk: &v1.GCEPersistentDiskVolumeSource{PDName: "disk-1", FSType: "ext4"},
	}})
	s.createPod(pod)
	s.stillNotRunning("its in-tree GCE PD volume")
	// csi-translation-lib's handle for an inline GCE PD volume without a zone.
	setVolumesAttached(t, s.ctx, s.client, s.node, UniqueVolumeName("pd.csi.storage.gke.io", "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/disk-1"))
	s.waitRunning("pod Running once the translated volume is attached")
}

func TestTrimForStandIn_keepsWhatTheStandInReads(t *testing.T) {
	claim := &v1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: "ns", UID: "u1", ResourceVersion: "7",
			Labels: map[string]string{"app": "x"}, ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "m"}}},
		Spec:   v1.PersistentVolumeClaimSpec{VolumeName: "pv-1", AccessModes: []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}},
		Status: v1.PersistentVolumeClaimStatus{Phase: v1.ClaimBound},
	}
	got, err := trimForStandIn(claim)
	if err != nil {
		t.Fatal(err)
	}
	want := &v1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: "ns", UID: "u1", ResourceVersion: "7"},
		Spec:       v1.PersistentVolumeClaimSpec{VolumeName: "pv-1"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("trimmed claim = %+v, want %+v", got, want)
	}
	again, _ := trimForStandIn(got)
	if !reflect.DeepEqual(again, want) {
		t.Errorf("trimming twice = %+v, want %+v", again, want)
	}
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "m"}}},
		Spec: v1.PodSpec{NodeName: "n1", Containers: []v1.Container{{Name: "c"}}}}
	out, _ := trimForStandIn(pod)
	if p := out.(*v1.Pod); p.ManagedFields != nil || p.Spec.NodeName != "n1" || len(p.Spec.Containers) != 1 {
		t.Errorf("pod after the transform = %+v, want only its managed fields gone", p)
	}
}
