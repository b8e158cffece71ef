package localcluster

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
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
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, cond); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
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
	if err := k.AddNode(ctx, NodeConfig{Name: "reg-node", Drivers: map[string]string{"b.csi.test": "b-id", "a.csi.test": "a-id"}}); err != nil {
		t.Fatal(err)
	}
	node, err := client.CoreV1().Nodes().Get(ctx, "reg-node", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := node.Annotations[ControllerManagedAnnotation]; !ok {
		t.Errorf("node annotations = %v, want %s", node.Annotations, ControllerManagedAnnotation)
	}
	if !nodeReady(node) {
		t.Errorf("node conditions = %v, want Ready=True", node.Status.Conditions)
	}
	csiNode, err := client.StorageV1().CSINodes().Get(ctx, "reg-node", metav1.GetOptions{})
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

	if err := k.SetReady(ctx, "reg-node", false); err != nil {
		t.Fatal(err)
	}
	if node, _ := client.CoreV1().Nodes().Get(ctx, "reg-node", metav1.GetOptions{}); nodeReady(node) {
		t.Errorf("node still Ready after SetReady(false)")
	}
	taint := v1.Taint{Key: OutOfServiceTaint, Value: "nodeshutdown", Effect: v1.TaintEffectNoExecute}
	if err := k.Taint(ctx, "reg-node", taint); err != nil {
		t.Fatal(err)
	}
	if node, _ := client.CoreV1().Nodes().Get(ctx, "reg-node", metav1.GetOptions{}); !slices.ContainsFunc(node.Spec.Taints, func(t v1.Taint) bool { return t.Key == OutOfServiceTaint }) {
		t.Errorf("taints = %v, want %s", node.Spec.Taints, OutOfServiceTaint)
	}
	if err := k.DeleteNode(ctx, "reg-node"); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Nodes().Get(ctx, "reg-node", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("node after DeleteNode: err = %v, want NotFound", err)
	}
	if _, err := client.StorageV1().CSINodes().Get(ctx, "reg-node", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("CSINode after DeleteNode: err = %v, want NotFound", err)
	}
}

func TestKubeletStartsPodOnlyAfterAttachAndReleasesVolumeOnDelete(t *testing.T) {
	ctx := testContext(t)
	k, client := startKubelet(t, ctx)
	const ns, node, driver = "kubelet-attach", "attach-node", "attach.csi.test"
	if err := CreateNamespace(ctx, client, ns); err != nil {
		t.Fatal(err)
	}
	if err := k.AddNode(ctx, NodeConfig{Name: node, Drivers: map[string]string{driver: "n1"}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := CreateBoundVolume(ctx, client, VolumeSpec{Namespace: ns, Name: "pv-attach", Driver: driver}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Pods(ns).Create(ctx, NewPod(ns, "app", node, "pv-attach"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	unique := UniqueVolumeName(driver, "pv-attach")

	// Unrelated node status churn makes the stand-in re-sync the node; the
	// Pod must still wait for its own volume.
	setVolumesAttached(t, ctx, client, node, UniqueVolumeName(driver, "someone-else"))
	eventually(t, ctx, "node synced with the unrelated volume", func(ctx context.Context) (bool, error) {
		n, err := k.nodes.Get(node)
		return err == nil && len(n.Status.VolumesAttached) == 1, nil
	})
	k.queue.Add(node)
	time.Sleep(200 * time.Millisecond) // let a pass run; nothing may change
	pod, err := client.CoreV1().Pods(ns).Get(ctx, "app", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Status.Phase == v1.PodRunning {
		t.Fatalf("pod Running before its volume is attached")
	}
	if n, _ := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); len(n.Status.VolumesInUse) != 0 {
		t.Fatalf("volumesInUse = %v before attach, want empty", n.Status.VolumesInUse)
	}

	setVolumesAttached(t, ctx, client, node, unique)
	eventually(t, ctx, "pod Running after attach", func(ctx context.Context) (bool, error) {
		pod, err := client.CoreV1().Pods(ns).Get(ctx, "app", metav1.GetOptions{})
		return err == nil && pod.Status.Phase == v1.PodRunning, nil
	})
	n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(n.Status.VolumesInUse, []v1.UniqueVolumeName{unique}) {
		t.Fatalf("volumesInUse = %v, want [%s]", n.Status.VolumesInUse, unique)
	}

	// Graceful delete: the stand-in releases the volume, then removes the Pod.
	if err := client.CoreV1().Pods(ns).Delete(ctx, "app", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "pod gone after delete", func(ctx context.Context) (bool, error) {
		_, err := client.CoreV1().Pods(ns).Get(ctx, "app", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	n, err = client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(n.Status.VolumesInUse) != 0 {
		t.Fatalf("volumesInUse = %v after the pod is gone, want empty", n.Status.VolumesInUse)
	}
}

func TestKubeletSkipsVolumesThatNeedNoAttach(t *testing.T) {
	ctx := testContext(t)
	k, client := startKubelet(t, ctx)
	const ns, node, driver = "kubelet-noattach", "noattach-node", "noattach.csi.test"
	if err := CreateNamespace(ctx, client, ns); err != nil {
		t.Fatal(err)
	}
	if _, err := client.StorageV1().CSIDrivers().Create(ctx, NewCSIDriver(driver, new(bool)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := k.AddNode(ctx, NodeConfig{Name: node, Drivers: map[string]string{driver: "n1"}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := CreateBoundVolume(ctx, client, VolumeSpec{Namespace: ns, Name: "pv-noattach", Driver: driver}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Pods(ns).Create(ctx, NewPod(ns, "app", node, "pv-noattach"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "pod Running without any attach", func(ctx context.Context) (bool, error) {
		pod, err := client.CoreV1().Pods(ns).Get(ctx, "app", metav1.GetOptions{})
		return err == nil && pod.Status.Phase == v1.PodRunning, nil
	})
}

func TestKubeletKeepsPodWithUnboundClaimPending(t *testing.T) {
	ctx := testContext(t)
	k, client := startKubelet(t, ctx)
	const ns, node = "kubelet-unbound", "unbound-node"
	if err := CreateNamespace(ctx, client, ns); err != nil {
		t.Fatal(err)
	}
	if err := k.AddNode(ctx, NodeConfig{Name: node}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Pods(ns).Create(ctx, NewPod(ns, "app", node, "missing-claim"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "pod seen by the stand-in", func(ctx context.Context) (bool, error) {
		objs, _ := k.pods.GetIndexer().ByIndex(podNodeIndex, node)
		return len(objs) == 1, nil
	})
	k.queue.Add(node)
	time.Sleep(200 * time.Millisecond)
	pod, err := client.CoreV1().Pods(ns).Get(ctx, "app", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Status.Phase == v1.PodRunning {
		t.Fatalf("pod with a missing PVC is Running")
	}
}

func nodeReady(node *v1.Node) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == v1.NodeReady {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}

func TestKubeletWaitsForTheCSITranslationOfAMigratedInlineVolume(t *testing.T) {
	ctx := testContext(t)
	k, client := startKubelet(t, ctx)
	const ns, node = "kubelet-inline-gce", "inline-gce-node"
	if err := CreateNamespace(ctx, client, ns); err != nil {
		t.Fatal(err)
	}
	if err := k.AddNode(ctx, NodeConfig{Name: node, Drivers: map[string]string{"pd.csi.storage.gke.io": "n1"}}); err != nil {
		t.Fatal(err)
	}
	pod := NewPod(ns, "app", node)
	pod.Spec.Volumes = append(pod.Spec.Volumes, v1.Volume{Name: "disk", VolumeSource: v1.VolumeSource{
		GCEPersistentDisk: &v1.GCEPersistentDiskVolumeSource{PDName: "disk-1", FSType: "ext4"},
	}})
	if _, err := client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	k.queue.Add(node)
	time.Sleep(200 * time.Millisecond) // let a pass run; the Pod must wait
	if p, err := client.CoreV1().Pods(ns).Get(ctx, "app", metav1.GetOptions{}); err != nil || p.Status.Phase == v1.PodRunning {
		t.Fatalf("pod = %v, %v; want it waiting for its in-tree GCE PD volume", p.Status.Phase, err)
	}
	// csi-translation-lib's handle for an inline GCE PD volume without a zone.
	setVolumesAttached(t, ctx, client, node, UniqueVolumeName("pd.csi.storage.gke.io", "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/disk-1"))
	eventually(t, ctx, "pod Running once the translated volume is attached", func(ctx context.Context) (bool, error) {
		p, err := client.CoreV1().Pods(ns).Get(ctx, "app", metav1.GetOptions{})
		return err == nil && p.Status.Phase == v1.PodRunning, nil
	})
}
