package latchlocal

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/kube/kubenames"
	"github.com/latchcsi/latch/internal/testsupport"
)

// With RealNodes (kube-scheduler, kube-controller-manager, hollow
// kubelets): the demo's timeline carries the kubelet's NodeStage and
// NodePublish before each Pod runs and NodeUnpublish and NodeUnstage
// before the volume leaves volumesInUse; then examples/statefulset.yaml,
// applied and deleted as kubectl would, gets both replicas scheduled,
// bound, attached, mounted and Running, and takes everything down with
// every volume unmounted before it is detached.
func TestRealNodesDemoAndStatefulSetExample(t *testing.T) {
	start := time.Now()
	logs := &testsupport.SyncBuffer{}
	ctx, env := startEnv(t, 6*time.Minute, Options{Nodes: 2, RealNodes: true, ProcessOutput: logs})
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("child processes' log (tail):\n%s", lastLines(logs.String(), 200))
		}
	})
	t.Logf("Ready with real nodes in %s", time.Since(start).Round(time.Millisecond))
	if env.Kubelet != nil || len(env.Hollow) != 2 {
		t.Fatalf("RealNodes: stand-in %v, %d hollow nodes; want no stand-in and 2 hollow nodes", env.Kubelet != nil, len(env.Hollow))
	}

	_, got := runDemo(t, ctx, env)
	for _, want := range [][]string{
		{"attach: VolumeAttachment attached", "attach: NodeStageVolume succeeded", "attach: NodePublishVolume succeeded", "attach: Pod Running"},
		{"detach: Pod app-1 deleted", "detach: NodeUnpublishVolume succeeded", "detach: NodeUnstageVolume succeeded", "detach: kubelet released the volume (volumesInUse)", "detach: ControllerUnpublishVolume succeeded"},
		{"conflict resolved: VolumeAttachment attached", "conflict resolved: NodeStageVolume succeeded", "conflict resolved: NodePublishVolume succeeded", "conflict resolved: Pod Running"},
	} {
		if !inOrder(got, want) {
			t.Errorf("demo steps lack, in this order, %q:\n%q", want, got)
		}
	}
	t.Logf("demo done after %s", time.Since(start).Round(time.Millisecond))

	m := readManifest(t, env.Cluster.RESTConfig(), "../../examples/statefulset.yaml")
	m.create(t, ctx)
	client := env.Client
	replicas := []string{"web-0", "web-1"}
	testsupport.Eventually(t, ctx, 3*time.Minute, "both replicas of StatefulSet web Running", func(ctx context.Context) (bool, error) {
		for _, name := range replicas {
			p, err := client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
			if err != nil || p.Status.Phase != v1.PodRunning {
				return false, nil
			}
		}
		return true, nil
	}, func() { t.Logf("calls:\n%s", calls(env.Driver.Calls())) })
	t.Logf("StatefulSet Running after %s", time.Since(start).Round(time.Millisecond))
	type placed struct{ pod, node, volume string }
	var all []placed
	for _, name := range replicas {
		p, err := client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Spec.NodeName == "" || !scheduled(p) {
			t.Errorf("Pod %s not placed by the scheduler: node %q, conditions %+v", name, p.Spec.NodeName, p.Status.Conditions)
		}
		pvc, err := client.CoreV1().PersistentVolumeClaims("default").Get(ctx, "data-"+name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if pvc.Status.Phase != v1.ClaimBound || pvc.Annotations["pv.kubernetes.io/bind-completed"] != "yes" {
			t.Errorf("PVC data-%s: phase %s, annotations %v; want Bound by kube-controller-manager's PV controller", name, pvc.Status.Phase, pvc.Annotations)
		}
		vol := pvc.Spec.VolumeName // the example's PVs are named as their handles
		va, err := client.StorageV1().VolumeAttachments().Get(ctx, kubenames.VolumeAttachmentName(vol, env.Opts.Driver, p.Spec.NodeName), metav1.GetOptions{})
		if err != nil || !va.Status.Attached {
			t.Errorf("VolumeAttachment of %s on %s: %+v, %v; want attached", vol, p.Spec.NodeName, va, err)
		}
		all = append(all, placed{name, p.Spec.NodeName, vol})
	}

	m.delete(t, ctx)
	testsupport.Eventually(t, ctx, 3*time.Minute, "everything of examples/statefulset.yaml gone, with its Pods, claims and VolumeAttachments", func(ctx context.Context) (bool, error) {
		if ok, _ := m.gone(t, ctx); !ok {
			return false, nil
		}
		for _, p := range all {
			if _, err := client.CoreV1().Pods("default").Get(ctx, p.pod, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return false, nil
			}
			if _, err := client.CoreV1().PersistentVolumeClaims("default").Get(ctx, "data-"+p.pod, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return false, nil
			}
			if _, err := client.StorageV1().VolumeAttachments().Get(ctx, kubenames.VolumeAttachmentName(p.volume, env.Opts.Driver, p.node), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return false, nil
			}
		}
		return true, nil
	}, func() {
		_, what := m.gone(t, ctx)
		t.Logf("left: %s; calls:\n%s", what, calls(env.Driver.Calls()))
	})
	t.Logf("StatefulSet deleted, volumes detached after %s", time.Since(start).Round(time.Millisecond))
	all2 := env.Driver.Calls()
	for _, p := range all {
		id := NodeID(nodeIndex(t, p.node))
		unpublish, ok1 := callOf(env.Driver.NodeCalls(id), "NodeUnpublishVolume", p.volume)
		unstage, ok2 := callOf(env.Driver.NodeCalls(id), "NodeUnstageVolume", p.volume)
		detach, ok3 := callOf(all2, "ControllerUnpublishVolume", p.volume)
		if !ok1 || !ok2 || !ok3 {
			t.Errorf("volume %s on %s: NodeUnpublish %v, NodeUnstage %v, ControllerUnpublish %v; want all three\n%s", p.volume, p.node, ok1, ok2, ok3, calls(all2))
			continue
		}
		if !unpublish.End.Before(unstage.Start) || !unstage.End.Before(detach.Start) {
			t.Errorf("volume %s on %s: want NodeUnpublish → NodeUnstage → ControllerUnpublish, got\n%s", p.volume, p.node, calls(all2))
		}
	}
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return len(env.Driver.Published("web-data-1"))+len(env.Driver.Published("web-data-2")) == 0, nil
	}); err != nil {
		t.Errorf("example volumes still published: %v, %v", env.Driver.Published("web-data-1"), env.Driver.Published("web-data-2"))
	}
}

// inOrder: want appears in got as a subsequence.
func inOrder(got, want []string) bool {
	i := 0
	for _, g := range got {
		if i < len(want) && g == want[i] {
			i++
		}
	}
	return i == len(want)
}

func scheduled(p *v1.Pod) bool {
	return slices.ContainsFunc(p.Status.Conditions, func(c v1.PodCondition) bool {
		return c.Type == v1.PodScheduled && c.Status == v1.ConditionTrue
	})
}

func nodeIndex(t *testing.T, node string) int {
	t.Helper()
	var i int
	if _, err := fmt.Sscanf(node, "node-%d", &i); err != nil {
		t.Fatalf("node %q is not one of latch-local's: %v", node, err)
	}
	return i
}

// callOf is the first successful call of method for volume.
func callOf(cs []csimock.Call, method, volume string) (csimock.Call, bool) {
	for _, c := range cs {
		if c.Method == method && c.VolumeID == volume && c.Done() && c.Code == codes.OK {
			return c, true
		}
	}
	return csimock.Call{}, false
}

func calls(cs []csimock.Call) string {
	var b strings.Builder
	for _, c := range cs {
		fmt.Fprintf(&b, "  #%d %s vol=%s node=%s endpoint=%s %s–%s %s\n", c.ID, c.Method, c.VolumeID, c.NodeID, c.Endpoint,
			c.Start.Format("15:04:05.000"), c.End.Format("15:04:05.000"), c.CodeName)
	}
	return b.String()
}

func lastLines(s string, n int) string {
	l := strings.Split(s, "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}
