package deploy_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/kube/kubenames"
	"github.com/latchcsi/latch/internal/testsupport"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/latchcsi/latch/internal/localcluster"
	"github.com/latchcsi/latch/internal/stack"
)

// startProcess runs one of the released binaries as a stack component,
// its output in dir/<bin>.log. Cleanup stops it (SIGTERM, SIGKILL 30s
// later) and, if the test failed, shows the end of its log; how it exited
// is not what these tests check.
func startProcess(t *testing.T, dir, bin string, args ...string) {
	t.Helper()
	logPath := filepath.Join(dir, bin+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	c, err := stack.Process(context.Background(), bin, logFile, filepath.Join(binaries(t), bin), args...)
	if err != nil {
		logFile.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Stop()
		logFile.Close()
		if t.Failed() {
			raw, _ := os.ReadFile(logPath)
			t.Logf("%s log (last lines):\n%s", bin, lastLines(string(raw), 20))
		}
	})
}

// scrape returns the names of the samples an endpoint exposes.
func scrape(ctx context.Context, addr string) (map[string]bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	names := map[string]bool{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			names[line[:i]] = true
		}
	}
	return names, sc.Err()
}

// The dashboard queries only metrics the binaries really export. The
// released binaries run against the in-process API server with the mock
// driver, the controller with leader election, and go through what every
// panel shows: an attach, a driver that lost an attachment (ListVolumes
// repair), a failing attach, a forced detach (out-of-service taint), an
// orphan record entry that is not a record and a VolumeAttachment create
// an admission policy refuses. Then both /metrics endpoints are scraped.
func TestDashboardQueriesOnlyMetricsTheBinariesExport(t *testing.T) {
	queried := dashboardMetrics(t)
	for _, want := range []string{"latch_attacher_attach_latency_seconds_bucket", "latch_attacher_csi_errors_total",
		"attach_detach_controller_attachdetach_controller_forced_detaches", "latch_workqueue_oldest_item_age_seconds", "attachdetach_controller_total_volumes"} {
		if _, ok := queried[want]; !ok {
			t.Errorf("dashboard does not query %s", want)
		}
	}

	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	client := cluster.Client()
	// Names of this run's own: the package shares one API server, and
	// -count=2 runs the test twice on it (the cluster-scoped CSIDriver,
	// Nodes and PVs would exist already).
	sfx := make([]byte, 3)
	_, _ = rand.Read(sfx)
	d := func(name string) string { return fmt.Sprintf("%s-%x", name, sfx) }
	driver := d("dashboard") + ".csi.latch.dev"
	nodes := map[string]string{d("dash-node-1"): d("dash-node-1") + "-id", d("dash-node-2"): d("dash-node-2") + "-id"}
	// An orphan record entry that is not a record: a load error.
	record := &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: kube.OrphanRecordName(driver)}, Data: map[string]string{"junk": "not a record"}}
	if _, err := client.CoreV1().ConfigMaps("default").Create(ctx, record, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.CoreV1().ConfigMaps("default").Delete(context.Background(), record.Name, metav1.DeleteOptions{})
	})
	remove, err := testsupport.DenyVolumeAttachmentsOf(ctx, client, d("dash-refused"), d("dash-freeze"), d("dash-freeze"))
	t.Cleanup(func() { remove(context.Background()) })
	if err != nil {
		t.Fatal(err)
	}

	// Only node 1 exists in the backend: publishing to node 2 is NotFound.
	dir, kubeconfig, socket := startMockDriver(ctx, t, driver, "--known-nodes="+nodes[d("dash-node-1")])
	attacherAddr, controllerAddr := testsupport.FreeAddr(t), testsupport.FreeAddr(t)
	startProcess(t, dir, "csi-attacher", "--kubeconfig="+kubeconfig, "--csi-address="+socket,
		"--http-endpoint="+attacherAddr, "--reconcile-sync=1s", "--retry-interval-start=200ms", "--v=4")
	startProcess(t, dir, "attachdetach-controller", "--kubeconfig="+kubeconfig, "--leader-elect-resource-namespace=default",
		"--leader-elect-resource-name="+d("dashboard-attachdetach-controller"), "--http-endpoint="+controllerAddr, "--v=4")

	kubelet, stopKubelet := startNodes(ctx, t, driver, nodes)
	for _, name := range []string{d("dash-ok"), d("dash-fail"), d("dash-refused")} {
		if _, _, err := localcluster.CreateBoundVolume(ctx, client, localcluster.VolumeSpec{Namespace: "default", Name: name, Driver: driver}); err != nil {
			t.Fatal(err)
		}
	}

	// 1. An attach.
	if _, err := client.CoreV1().Pods("default").Create(ctx, localcluster.NewPod("default", d("dash-app"), d("dash-node-1"), d("dash-ok")), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	okVA := kubenames.VolumeAttachmentName(d("dash-ok"), driver, d("dash-node-1"))
	waitFor(ctx, t, "VolumeAttachment "+okVA+" attached", func() (bool, error) {
		va, err := client.StorageV1().VolumeAttachments().Get(ctx, okVA, metav1.GetOptions{})
		return err == nil && va.Status.Attached, nil
	})

	// 2. The backend loses the attachment behind Kubernetes' back; the
	// ListVolumes reconcile notices and publishes again.
	unpublish(ctx, t, socket, d("dash-ok"), nodes[d("dash-node-1")])
	waitFor(ctx, t, "a ListVolumes repair counted", func() (bool, error) {
		names, err := scrape(ctx, attacherAddr)
		return err == nil && names["latch_attacher_reconcile_repairs_total"], nil
	})

	// 3. A failing attach.
	if _, err := client.CoreV1().Pods("default").Create(ctx, localcluster.NewPod("default", d("dash-stuck"), d("dash-node-2"), d("dash-fail")), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	failVA := kubenames.VolumeAttachmentName(d("dash-fail"), driver, d("dash-node-2"))
	waitFor(ctx, t, "attachError on "+failVA, func() (bool, error) {
		va, err := client.StorageV1().VolumeAttachments().Get(ctx, failVA, metav1.GetOptions{})
		return err == nil && va.Status.AttachError != nil, nil
	})

	// 4. A VolumeAttachment create the policy refuses.
	if _, err := client.CoreV1().Pods("default").Create(ctx, localcluster.NewPod("default", d("dash-refused"), d("dash-node-1"), d("dash-refused")), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, "a refused VolumeAttachment create counted", func() (bool, error) {
		names, err := scrape(ctx, controllerAddr)
		return err == nil && names["latch_attachdetach_volumeattachment_create_errors_total"], nil
	})

	// 5. Node 1 goes down with the volume in use and gets the
	// out-of-service taint: a forced detach.
	waitFor(ctx, t, "dash-node-1 reports the volume in use", func() (bool, error) {
		n, err := client.CoreV1().Nodes().Get(ctx, d("dash-node-1"), metav1.GetOptions{})
		return err == nil && len(n.Status.VolumesInUse) > 0, nil
	})
	stopKubelet()
	if err := kubelet.SetReady(ctx, d("dash-node-1"), false); err != nil {
		t.Fatal(err)
	}
	if err := client.CoreV1().Pods("default").Delete(ctx, d("dash-app"), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := kubelet.Taint(ctx, d("dash-node-1"), v1.Taint{Key: localcluster.OutOfServiceTaint, Value: "nodeshutdown", Effect: v1.TaintEffectNoExecute}); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, "VolumeAttachment "+okVA+" deleted", func() (bool, error) {
		_, err := client.StorageV1().VolumeAttachments().Get(ctx, okVA, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})

	exported := map[string]bool{}
	for _, addr := range []string{attacherAddr, controllerAddr} {
		names, err := scrape(ctx, addr)
		if err != nil {
			t.Fatal(err)
		}
		for n := range names {
			exported[n] = true
		}
	}
	var missing []string
	for name, panel := range queried {
		if !exported[name] {
			missing = append(missing, fmt.Sprintf("%s (%s)", name, panel))
		}
	}
	slices.Sort(missing)
	for _, m := range missing {
		t.Errorf("the dashboard queries %s, which neither binary exported", m)
	}
	t.Logf("exported: %v", slices.Sorted(maps.Keys(exported)))
}

// unpublish calls ControllerUnpublishVolume on the driver directly, as if
// the storage backend had dropped the attachment by itself.
func unpublish(ctx context.Context, t *testing.T, socket, volume, nodeID string) {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := csi.NewControllerClient(conn).ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: volume, NodeId: nodeID}); err != nil {
		t.Fatalf("ControllerUnpublishVolume %s from %s: %v", volume, nodeID, err)
	}
}

func waitFor(ctx context.Context, t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) { return cond() }); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}
