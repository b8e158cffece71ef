package deploy_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/kube/kubenames"
	"github.com/latchcsi/latch/internal/localcluster"
	"github.com/latchcsi/latch/internal/stack"
	"github.com/latchcsi/latch/internal/testsupport"
)

// klogError matches a klog error line ("E0102 15:04:05.000000 ...").
var klogError = regexp.MustCompile(`(?m)^E\d{4} .*$`)

// startMockDriver runs csi-mock-driver (controller service only) for
// driver with extra args, in a new temporary directory that also holds a
// kubeconfig of the package's cluster, and waits for its socket.
func startMockDriver(ctx context.Context, t *testing.T, driver string, args ...string) (dir, kubeconfig, socket string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "lbin")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := cluster.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	socket = filepath.Join(dir, "csi.sock")
	startProcess(t, dir, "csi-mock-driver", append([]string{"--csi-address=" + socket, "--driver-name=" + driver,
		"--node-service=false", "--auto-create-volumes=true"}, args...)...)
	waitFor(ctx, t, "the mock driver's socket", func() (bool, error) { _, err := os.Stat(socket); return err == nil, nil })
	return dir, kubeconfig, socket
}

// startNodes creates driver's CSIDriver object and nodes (name → the
// driver's node ID) served by a stand-in kubelet, which runs until stop or
// the end of the test.
func startNodes(ctx context.Context, t *testing.T, driver string, nodes map[string]string) (kubelet *localcluster.Kubelet, stop func()) {
	t.Helper()
	client := cluster.Client()
	if _, err := client.StorageV1().CSIDrivers().Create(ctx, localcluster.NewCSIDriver(driver, nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kubelet = localcluster.NewKubelet(client)
	kubeletCtx, stop := context.WithCancel(ctx)
	t.Cleanup(stop)
	go kubelet.Run(kubeletCtx, 2)
	for node, id := range nodes {
		if err := kubelet.AddNode(ctx, localcluster.NodeConfig{Name: node, Drivers: map[string]string{driver: id}}); err != nil {
			t.Fatal(err)
		}
	}
	return kubelet, stop
}

// A clean SIGTERM of either released binary, with leader election on and
// an attach behind it, logs no error line: the events recorded while the
// workers drain and the elector's "stopped leading" on releasing the Lease
// reach the API server instead of "Unable to record event (will not
// retry!)". Both exit 0 and release their Lease.
func TestCleanSIGTERMLogsNoErrorLineAndRecordsStoppedLeading(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	client := cluster.Client()
	// Names of this run's own: the package shares one API server, and
	// -count=2 runs the test twice on it.
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	run := hex.EncodeToString(suffix)
	driver := "shutdown-" + run + ".csi.latch.dev"
	node := "shutdown-node-" + run
	ns := "latch-shutdown-" + run
	vol := "shutdown-vol-" + run
	if err := localcluster.CreateNamespace(ctx, client, ns); err != nil {
		t.Fatal(err)
	}
	_, kubeconfig, socket := startMockDriver(ctx, t, driver)

	start := func(bin string, args ...string) (*stack.Component, *testsupport.SyncBuffer) {
		out := &testsupport.SyncBuffer{}
		c, err := stack.Process(context.Background(), bin, out, filepath.Join(binaries(t), bin), args...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = c.Stop()
			if t.Failed() {
				t.Logf("%s output (last lines):\n%s", bin, lastLines(out.String(), 30))
			}
		})
		return c, out
	}
	attacher, attOut := start("csi-attacher", "--kubeconfig="+kubeconfig, "--csi-address="+socket,
		"--leader-election", "--leader-election-namespace="+ns, "--http-endpoint=", "--v=2")
	controller, ctrlOut := start("attachdetach-controller", "--kubeconfig="+kubeconfig,
		"--leader-elect=true", "--leader-elect-resource-namespace="+ns, "--http-endpoint=", "--v=2")

	startNodes(ctx, t, driver, map[string]string{node: node + "-id"})
	if _, _, err := localcluster.CreateBoundVolume(ctx, client, localcluster.VolumeSpec{Namespace: ns, Name: vol, Driver: driver}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Pods(ns).Create(ctx, localcluster.NewPod(ns, "shutdown-app", node, vol), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	va := kubenames.VolumeAttachmentName(vol, driver, node)
	waitFor(ctx, t, "VolumeAttachment "+va+" attached", func() (bool, error) {
		got, err := client.StorageV1().VolumeAttachments().Get(ctx, va, metav1.GetOptions{})
		return err == nil && got.Status.Attached, nil
	})

	for _, b := range []struct {
		name  string
		c     *stack.Component
		out   *testsupport.SyncBuffer
		lease string
	}{
		{"attachdetach-controller", controller, ctrlOut, "latch-attachdetach-controller"},
		{"csi-attacher", attacher, attOut, kube.LeaseName(driver)},
	} {
		holder := func() string {
			l, err := client.CoordinationV1().Leases(ns).Get(ctx, b.lease, metav1.GetOptions{})
			if err != nil || l.Spec.HolderIdentity == nil {
				return ""
			}
			return *l.Spec.HolderIdentity
		}
		waitFor(ctx, t, b.name+" holds Lease "+b.lease, func() (bool, error) { return holder() != "", nil })
		before := len(b.out.String())
		if err := b.c.Stop(); err != nil {
			t.Errorf("%s after SIGTERM: %v", b.name, err)
		}
		after := b.out.String()[before:]
		for _, line := range klogError.FindAllString(after, -1) {
			t.Errorf("%s logged an error line during its clean shutdown: %s", b.name, line)
		}
		if strings.Contains(after, "Unable to record event") {
			t.Errorf("%s lost an event during its clean shutdown", b.name)
		}
		if h := holder(); h != "" {
			t.Errorf("%s exited without releasing Lease %s/%s (holder %q)", b.name, ns, b.lease, h)
		}
		// The last event of the process, recorded after ctx was done,
		// reached the API server.
		waitFor(ctx, t, b.name+`'s "stopped leading" event`, func() (bool, error) {
			evs, err := client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Lease,involvedObject.name=" + b.lease})
			if err != nil {
				return false, err
			}
			for _, e := range evs.Items {
				if e.Reason == "LeaderElection" && strings.HasSuffix(e.Message, "stopped leading") {
					return true, nil
				}
			}
			return false, nil
		})
	}
}
