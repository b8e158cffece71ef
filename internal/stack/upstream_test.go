package stack

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/localcluster"
	"github.com/latchcsi/latch/internal/testsupport"
)

// The real upstream pair (kube-controller-manager's attach/detach
// controller and the external-attacher) attaches and detaches a Pod's
// volume through the stack's mock driver and kubelet stand-in, and both
// serve their /metrics where Upstream says.
func TestUpstreamPeersAttachAndDetachAPodsVolume(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	const driver, node, ns, vol = "upstream.csi.latch.test", "upstream-node", "upstream-ns", "upstream-vol"
	s, err := Start(ctx, Options{
		Cluster: cluster, Driver: driver, Attacher: AttacherNone, NoController: true,
		Nodes: []localcluster.NodeConfig{{Name: node}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := s.Stop(); err != nil {
			t.Errorf("Stop: %v", err)
		}
	}()
	dir := testsupport.SocketDir(t)
	kubeconfig, socket := filepath.Join(dir, "kubeconfig"), filepath.Join(dir, "csi.sock")
	if err := s.Cluster.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	drv, err := MockDriver(ctx, driver, socket, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer drv.Stop()
	out := &testsupport.SyncBuffer{Max: 64 << 10}
	ea, err := StartUpstreamAttacher(ctx, UpstreamAttacherConfig{CSIAddress: socket, Kubeconfig: kubeconfig, Timeout: 10 * time.Second, Output: out})
	if err != nil {
		t.Fatal(err)
	}
	kcm, err := StartKubeControllerManager(ctx, KubeControllerManagerConfig{Kubeconfig: kubeconfig, Output: out})
	if err != nil {
		_ = ea.Stop()
		t.Fatal(err)
	}
	defer func() {
		if err := kcm.Stop(); err != nil {
			t.Errorf("kube-controller-manager: %v", err)
		}
		if err := ea.Stop(); err != nil {
			t.Errorf("external-attacher: %v", err)
		}
		if t.Failed() {
			t.Logf("upstream output (tail):\n%s", out.String())
		}
	}()
	for _, want := range []string{"--controllers=attachdetach", "--leader-elect=false"} {
		if !strings.Contains(strings.Join(kcm.Args, " "), want) {
			t.Errorf("kube-controller-manager args %v lack %s", kcm.Args, want)
		}
	}

	if err := localcluster.CreateNamespace(ctx, s.Client, ns); err != nil {
		t.Fatal(err)
	}
	if _, _, err := localcluster.CreateBoundVolume(ctx, s.Client, localcluster.VolumeSpec{Namespace: ns, Name: vol, Driver: driver}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Client.CoreV1().Pods(ns).Create(ctx, localcluster.NewPod(ns, "app", node, vol), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, ctx, 2*time.Minute, "the Pod running", func(ctx context.Context) (bool, error) {
		p, err := s.Client.CoreV1().Pods(ns).Get(ctx, "app", metav1.GetOptions{})
		return err == nil && p.Status.Phase == v1.PodRunning, err
	})
	n, err := s.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	unique := localcluster.UniqueVolumeName(driver, vol)
	if len(n.Status.VolumesAttached) != 1 || n.Status.VolumesAttached[0].Name != unique {
		t.Errorf("node volumesAttached = %v, want only %s", n.Status.VolumesAttached, unique)
	}
	// Upstream may publish twice, milliseconds apart, reading its own
	// write from a stale cache (docs/interop.md, "duplicate
	// ControllerPublish"): at least once, at most twice.
	if got := drv.PublishCount(vol, NodeID(node)); got < 1 || got > 2 {
		t.Errorf("ControllerPublish of %s: %d calls, want 1 (or 2: upstream's known duplicate)", vol, got)
	}
	eam, err := ea.Scrape(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := eam.Find("csi_sidecar_operations_seconds_count", map[string]string{"method_name": "/csi.v1.Controller/ControllerPublishVolume"}); len(got) == 0 {
		t.Errorf("the external-attacher's /metrics has no ControllerPublishVolume operations")
	}
	kcmm, err := kcm.Scrape(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := kcmm.Find("attachdetach_controller_total_volumes", nil); len(got) == 0 {
		t.Errorf("kube-controller-manager's /metrics has no attachdetach_controller_total_volumes")
	}

	if err := s.Client.CoreV1().Pods(ns).Delete(ctx, "app", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, ctx, 2*time.Minute, "the VolumeAttachment gone and the volume unpublished", func(ctx context.Context) (bool, error) {
		if gone, err := noVolumeAttachmentOf(ctx, s, driver); !gone || err != nil {
			return false, err
		}
		unpublished := 0
		for _, c := range drv.CallsTo("ControllerUnpublishVolume") {
			if c.VolumeID == vol && c.NodeID == NodeID(node) && c.Done() && c.Code == codes.OK {
				unpublished++
			}
		}
		return unpublished == 1 && len(drv.Published(vol)) == 0, nil
	})
}

func TestUpstreamArgsKeepTheCallersFlagsLast(t *testing.T) {
	args := UpstreamAttacherArgs(UpstreamAttacherConfig{CSIAddress: "/csi.sock", Kubeconfig: "/kc", HTTPEndpoint: "127.0.0.1:1",
		LeaderElection: true, Args: []string{"--v=2"}})
	want := "--v=5 --csi-address=/csi.sock --kubeconfig=/kc --http-endpoint=127.0.0.1:1 --leader-election --leader-election-namespace=default --v=2"
	if got := strings.Join(args, " "); got != want {
		t.Errorf("attacher args = %s, want %s", got, want)
	}
	kargs := KubeControllerManagerArgs(KubeControllerManagerConfig{Kubeconfig: "/kc", SecureAddr: "127.0.0.1:2", CertDir: os.TempDir(),
		Controllers: []string{"*", "-attachdetach"}, LeaderElect: true})
	joined := strings.Join(kargs, " ")
	for _, want := range []string{"--controllers=*,-attachdetach", "--leader-elect=true", "--bind-address=127.0.0.1", "--secure-port=2",
		"--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics"} {
		if !strings.Contains(joined, want) {
			t.Errorf("kube-controller-manager args %s lack %s", joined, want)
		}
	}
}
