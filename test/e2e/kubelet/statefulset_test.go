package kubelet_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/kube/kubenames"
	"github.com/latchcsi/latch/internal/stack"
	"github.com/latchcsi/latch/internal/testsupport"
)

// TestStatefulSetOnRealControlPlane: nothing of Kubernetes played by
// latch's stand-ins. The real kube-scheduler, kube-controller-manager
// (every controller but attachdetach) and two hollow kubelets, with
// latch's attach/detach controller and csi-attacher. A StatefulSet with a
// volumeClaimTemplate of a StorageClass (WaitForFirstConsumer, no
// provisioner) over pre-provisioned PVs: kcm's StatefulSet controller
// creates the Pods and claims, the scheduler places the Pods (no nodeName
// set by the test) and picks the PVs, kcm's PV controller completes the
// binding, the kubelets mount the volumes once attached and run the Pods
// with their service-account token (kcm publishes kube-root-ca.crt).
// Scaled to 0: each volume is unpublished and unstaged on its node before
// its VolumeAttachment is deleted and ControllerUnpublish is called, and
// no VolumeAttachment is left.
func TestStatefulSetOnRealControlPlane(t *testing.T) {
	start := time.Now()
	r := newRig(t, 6*time.Minute, rigOptions{
		ControlPlane: true,
		Mock: func(c *csimock.Config) {
			c.Faults = append(c.Faults, csimock.Rule{ID: "slow-unstage", Method: "NodeUnstageVolume", Latency: unstageDelay})
		},
	})
	t.Logf("kube-controller-manager and kube-scheduler serving after %s", time.Since(start).Round(time.Millisecond))
	ctx, s, client, ns, hist := r.ctx, r.s, r.client, r.ns, r.hist
	const driver = testDriver
	class, set := "latch-sts-"+r.prefix, "web"
	nodes := []string{r.addNode("a", 0).Name, r.addNode("b", 0).Name}
	t.Logf("nodes %v Ready with the driver registered after %s", nodes, time.Since(start).Round(time.Millisecond))
	dumpCalls := r.dumpCalls

	// Storage: a class no provisioner serves, and one PV per replica.
	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	if _, err := client.StorageV1().StorageClasses().Create(ctx, &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: class},
		Provisioner:       "kubernetes.io/no-provisioner",
		VolumeBindingMode: &wffc,
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	const replicas = 2
	for i := range replicas {
		pv := &v1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-pv-%d", class, i)},
			Spec: v1.PersistentVolumeSpec{
				Capacity:                      v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")},
				AccessModes:                   []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
				PersistentVolumeReclaimPolicy: v1.PersistentVolumeReclaimRetain,
				StorageClassName:              class,
				PersistentVolumeSource: v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{
					Driver: driver, VolumeHandle: fmt.Sprintf("%s-vol-%d", class, i), FSType: "ext4",
				}},
			},
		}
		if _, err := client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	sts := statefulSet(ns, set, class, replicas)
	if _, err := client.AppsV1().StatefulSets(ns).Create(ctx, sts, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// Every replica Running on a node the scheduler chose, its claim
	// bound by kcm, its volume attached.
	pods := make([]string, replicas)
	for i := range pods {
		pods[i] = fmt.Sprintf("%s-%d", set, i)
	}
	testsupport.Eventually(t, ctx, 3*time.Minute, "every replica of StatefulSet "+set+" Running", func(ctx context.Context) (bool, error) {
		for _, name := range pods {
			p, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) || (err == nil && p.Status.Phase != v1.PodRunning) {
				return false, nil
			}
			if err != nil {
				return false, err
			}
		}
		return true, nil
	}, dumpCalls)
	t.Logf("%d replicas Running after %s", replicas, time.Since(start).Round(time.Millisecond))

	if _, err := client.CoreV1().ConfigMaps(ns).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{}); err != nil {
		t.Errorf("ConfigMap kube-root-ca.crt in %s (kcm's root-ca-cert-publisher): %v", ns, err)
	}
	calls := s.Driver.Calls()
	type placed struct{ pod, node, volume, va string }
	var all []placed
	for _, name := range pods {
		p, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !podScheduledBy(p, scheduler) || !containsString(nodes, p.Spec.NodeName) {
			t.Errorf("Pod %s: node %q, scheduler %q, PodScheduled %v; want one of %v chosen by default-scheduler", name, p.Spec.NodeName, p.Spec.SchedulerName, condition(p, v1.PodScheduled), nodes)
		}
		if !mountsServiceAccountToken(p) {
			t.Errorf("Pod %s runs without a service-account token volume: %+v", name, p.Spec.Volumes)
		}
		claim := "data-" + name
		pvc, err := client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, claim, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// pv.kubernetes.io/bind-completed is written by the PV controller
		// when it completes a binding: kcm's, nothing of latch's.
		if pvc.Status.Phase != v1.ClaimBound || pvc.Spec.VolumeName == "" || pvc.Annotations["pv.kubernetes.io/bind-completed"] != "yes" {
			t.Fatalf("PVC %s/%s: phase %s, volume %q, annotations %v; want Bound by kcm's PV controller", ns, claim, pvc.Status.Phase, pvc.Spec.VolumeName, pvc.Annotations)
		}
		pv, err := client.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		vol := pv.Spec.CSI.VolumeHandle
		va := kubenames.VolumeAttachmentName(vol, driver, p.Spec.NodeName)
		all = append(all, placed{name, p.Spec.NodeName, vol, va})
		attached := hist.mustFirst(t, "VolumeAttachment "+va+" attached", vaNamed(va, func(va *storagev1.VolumeAttachment) bool { return va.Status.Attached }))
		running := hist.mustFirst(t, "Pod "+name+" Running", podNamed(name, func(p *v1.Pod) bool { return p.Status.Phase == v1.PodRunning }))
		if running.RV < attached.RV {
			t.Errorf("Pod %s Running (%s) before its VolumeAttachment was attached (%s)", name, running, attached)
		}
		publish := mustCall(t, calls, "ControllerPublishVolume", vol, codes.OK)
		stage := mustCall(t, calls, "NodeStageVolume", vol, codes.OK)
		nodePublish := mustCall(t, calls, "NodePublishVolume", vol, codes.OK)
		nodeID := stack.NodeID(p.Spec.NodeName)
		if publish.NodeID != nodeID || stage.Endpoint != nodeID || nodePublish.Endpoint != nodeID {
			t.Errorf("volume %s of Pod %s on %s: published to %q, staged on %q, node-published on %q", vol, name, p.Spec.NodeName, publish.NodeID, stage.Endpoint, nodePublish.Endpoint)
		}
		if !publish.End.Before(stage.Start) || !stage.End.Before(nodePublish.Start) {
			t.Errorf("volume %s: want ControllerPublish → NodeStage → NodePublish, got\n%s", vol, callTable(calls))
		}
	}

	// Scale to 0: the StatefulSet controller deletes the Pods.
	if _, err := client.AppsV1().StatefulSets(ns).Patch(ctx, set, types.MergePatchType, []byte(`{"spec":{"replicas":0}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, ctx, 3*time.Minute, "replicas gone and every VolumeAttachment of "+class+" gone", func(ctx context.Context) (bool, error) {
		for _, p := range all {
			if _, err := client.CoreV1().Pods(ns).Get(ctx, p.pod, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return false, nil
			}
		}
		return noVolumeAttachments(ctx, client, class)
	}, dumpCalls)
	t.Logf("scaled to 0, every volume detached after %s", time.Since(start).Round(time.Millisecond))

	calls = s.Driver.Calls()
	for _, p := range all {
		unpublish := mustCall(t, calls, "NodeUnpublishVolume", p.volume, codes.OK)
		unstage := mustCall(t, calls, "NodeUnstageVolume", p.volume, codes.OK)
		ctrlUnpublish := mustCall(t, calls, "ControllerUnpublishVolume", p.volume, codes.OK)
		if !unpublish.End.Before(unstage.Start) || !unstage.End.Before(ctrlUnpublish.Start) {
			t.Errorf("volume %s of %s: want NodeUnpublish → NodeUnstage → ControllerUnpublish, got\n%s", p.volume, p.pod, callTable(calls))
		}
		unique := kubenames.UniqueVolumeName(driver, p.volume)
		inUseAdded := hist.mustFirst(t, "volume "+p.volume+" in Node "+p.node+"'s volumesInUse", nodeNamed(p.node, func(n *v1.Node) bool { return inUse(n, unique) }))
		dropped := hist.mustFirst(t, "volume "+p.volume+" leaves Node "+p.node+"'s volumesInUse", after(inUseAdded.RV, nodeNamed(p.node, func(n *v1.Node) bool { return !inUse(n, unique) })))
		deleting := hist.mustFirst(t, "VolumeAttachment "+p.va+" deleted", vaNamed(p.va, func(va *storagev1.VolumeAttachment) bool { return va.DeletionTimestamp != nil }))
		if deleting.RV < dropped.RV {
			t.Errorf("VolumeAttachment %s deleted (%s) before %s left volumesInUse (%s)", p.va, deleting, p.volume, dropped)
		}
		if !dropped.Observed.After(unstage.End) {
			t.Errorf("volume %s left volumesInUse (%s) before NodeUnstage ended (%s)", p.volume, dropped, stamp(unstage.End))
		}
		if nv := s.Driver.NodeVolumes(stack.NodeID(p.node)); len(nv.Staged)+len(nv.Published) != 0 {
			t.Errorf("node %s still has volumes after scale to 0: %+v", p.node, nv)
		}
	}
	if err := client.AppsV1().StatefulSets(ns).Delete(ctx, set, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, ctx, time.Minute, "StatefulSet "+set+" gone", func(ctx context.Context) (bool, error) {
		_, err := client.AppsV1().StatefulSets(ns).Get(ctx, set, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if ok, err := noVolumeAttachments(ctx, client, class); !ok || err != nil {
		t.Errorf("VolumeAttachments left after the StatefulSet's deletion (err %v)", err)
	}
}

// statefulSet is a StatefulSet of replicas Pods, each mounting its own
// claim "data" of class (Parallel: the replicas start together).
func statefulSet(ns, name, class string, replicas int32) *appsv1.StatefulSet {
	labels := map[string]string{"app": name}
	return &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: appsv1.StatefulSetSpec{
			Replicas:            &replicas,
			Selector:            &metav1.LabelSelector{MatchLabels: labels},
			PodManagementPolicy: appsv1.ParallelPodManagement,
			Template: v1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: v1.PodSpec{Containers: []v1.Container{{
					Name: "app", Image: "registry.invalid/app:latest",
					VolumeMounts: []v1.VolumeMount{{Name: "data", MountPath: "/data"}},
				}}},
			},
			VolumeClaimTemplates: []v1.PersistentVolumeClaim{{
				ObjectMeta: metav1.ObjectMeta{Name: "data"},
				Spec: v1.PersistentVolumeClaimSpec{
					AccessModes:      []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce},
					StorageClassName: &class,
					Resources:        v1.VolumeResourceRequirements{Requests: v1.ResourceList{v1.ResourceStorage: resource.MustParse("1Gi")}},
				},
			}},
		},
	}
}

// podScheduledBy: the Pod is PodScheduled and names scheduler.
func podScheduledBy(p *v1.Pod, scheduler string) bool {
	return p.Spec.SchedulerName == scheduler && condition(p, v1.PodScheduled) == v1.ConditionTrue
}

func condition(p *v1.Pod, t v1.PodConditionType) v1.ConditionStatus {
	for _, c := range p.Status.Conditions {
		if c.Type == t {
			return c.Status
		}
	}
	return ""
}

// mountsServiceAccountToken: the Pod has the projected token volume the
// ServiceAccount admission plugin adds (kube-api-access-*), which the
// kubelet can mount only with the namespace's kube-root-ca.crt.
func mountsServiceAccountToken(p *v1.Pod) bool {
	for _, v := range p.Spec.Volumes {
		if strings.HasPrefix(v.Name, "kube-api-access-") && v.Projected != nil {
			return true
		}
	}
	return false
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// noVolumeAttachments: no VolumeAttachment of a PV of class is left.
func noVolumeAttachments(ctx context.Context, client kubernetes.Interface, class string) (bool, error) {
	vas, err := client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		return false, err
	}
	for _, va := range vas.Items {
		if pv := va.Spec.Source.PersistentVolumeName; pv != nil && strings.HasPrefix(*pv, class+"-") {
			return false, nil
		}
	}
	return true, nil
}

// deleteNode removes a stopped hollow node's Node object: a Node left
// behind still looks Ready (until a node lifecycle controller notices the
// missing heartbeats), and a later test's scheduler would place Pods on it.
func deleteNode(t *testing.T, client kubernetes.Interface, name string) {
	t.Helper()
	if err := client.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("delete Node %s: %v", name, err)
	}
}
