package interop

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/localcluster"
	"github.com/latchcsi/latch/internal/stack"
	"github.com/latchcsi/latch/internal/testsupport"
)

// Dashboards and alerts written for the upstream components must keep
// working after the swap: the same scenario (one attach and one detach,
// then a forced detach from an out-of-service node) runs
// once with the real external-attacher and kube-controller-manager and
// once with latch's csi-attacher and attachdetach-controller, and every
// metric name and label set upstream exposes must be in latch's /metrics
// too. Additions are fine (docs/metrics.md lists them).

// mxDriver is not a migrated driver: csi_sidecar_operations_seconds has no
// migrated label for it upstream.
const mxDriver = "metrics.csi.latch.test"

// Families not compared: the Go runtime and process collectors, the
// registry's own bookkeeping, and the counters of k8s.io/apiserver
// packages external-attacher links (for its feature gates and signal
// handler) but never runs: they stay at zero in a sidecar.
var mxIgnoredPrefixes = []string{"go_", "process_", "registered_metrics_", "disabled_metrics_", "hidden_metrics_", "apiserver_", "aggregator_"}

// kube-controller-manager serves every metric of the Kubernetes libraries
// it links (API server authentication, authorization, ...). Compared are
// the families of the attach/detach controller and its volume operations,
// its leader election, its workqueues and its API client (client-go's
// rest_client_* metrics, which dashboards of API traffic read).
var mxKCMPrefixes = []string{
	"attach_detach_controller_", "attachdetach_controller_", "storage_operation_duration_seconds",
	"storage_count_attachable_volumes_in_use", "leader_election_master_status", "workqueue_", "rest_client_",
}

// labelSets is, per sample name, the label-name sets seen (each as its
// sorted names joined by ","), with the values seen per label name.
type labelSets map[string]map[string]bool

func mxLabelSets(samples testsupport.Samples, keep func(name string) bool) (labelSets, map[string]map[string]map[string]bool) {
	sets := labelSets{}
	values := map[string]map[string]map[string]bool{}
	for _, s := range samples {
		if !keep(s.Name) {
			continue
		}
		names := slices.Sorted(maps.Keys(s.Labels))
		if sets[s.Name] == nil {
			sets[s.Name] = map[string]bool{}
			values[s.Name] = map[string]map[string]bool{}
		}
		sets[s.Name][strings.Join(names, ",")] = true
		for k, v := range s.Labels {
			if values[s.Name][k] == nil {
				values[s.Name][k] = map[string]bool{}
			}
			values[s.Name][k][v] = true
		}
	}
	return sets, values
}

// mxMissing lists each upstream sample name and label set ours lacks.
func mxMissing(upstream, ours labelSets) []string {
	var out []string
	for _, name := range slices.Sorted(maps.Keys(upstream)) {
		for _, set := range slices.Sorted(maps.Keys(upstream[name])) {
			if !ours[name][set] {
				have := slices.Sorted(maps.Keys(ours[name]))
				out = append(out, fmt.Sprintf("%s{%s} (latch has %q)", name, set, have))
			}
		}
	}
	return out
}

func mxKeepAttacher(name string) bool {
	for _, p := range mxIgnoredPrefixes {
		if strings.HasPrefix(name, p) {
			return false
		}
	}
	return true
}

func mxKeepKCM(name string) bool {
	for _, p := range mxKCMPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// mxWorld is one control plane, the mock driver, one attacher and one
// attach/detach controller, both with leader election on.
type mxWorld struct {
	s        *stack.Stack
	attacher func(ctx context.Context) (testsupport.Samples, error)
	ctrl     func(ctx context.Context) (testsupport.Samples, error)
}

// mxStart starts a world with upstream's peers (upstream) or latch's
// binaries, both attachers with the same flags.
func mxStart(t *testing.T, ctx context.Context, upstream bool) *mxWorld {
	t.Helper()
	const node = "mx-node"
	s, err := stack.Start(ctx, stack.Options{Driver: mxDriver, Attacher: stack.AttacherNone, NoController: true, Nodes: []localcluster.NodeConfig{{Name: node}}})
	if err != nil {
		t.Fatal(err)
	}
	out := &testsupport.SyncBuffer{Max: 1 << 20}
	w := &mxWorld{s: s}
	var stops []func() error
	t.Cleanup(func() {
		for i := len(stops) - 1; i >= 0; i-- {
			if err := stops[i](); err != nil {
				t.Errorf("stop: %v", err)
			}
		}
		if err := s.Stop(); err != nil {
			t.Errorf("stack: %v", err)
		}
		if t.Failed() {
			t.Logf("output:\n%s", out.String())
		}
	})
	dir, err := os.MkdirTemp("", "mx") // short: a unix socket path
	if err != nil {
		t.Fatal(err)
	}
	stops = append(stops, func() error { return os.RemoveAll(dir) })
	socket, kubeconfig := filepath.Join(dir, "csi.sock"), filepath.Join(dir, "kubeconfig")
	if err := s.Cluster.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	drv, err := stack.MockDriver(ctx, mxDriver, socket, nil)
	if err != nil {
		t.Fatal(err)
	}
	stops = append(stops, func() error { drv.Stop(); return nil })

	attacherEndpoint := testsupport.FreeAddr(t)
	cfg := stack.UpstreamAttacherConfig{CSIAddress: socket, Kubeconfig: kubeconfig, HTTPEndpoint: attacherEndpoint, Timeout: 10 * time.Second, LeaderElection: true, Output: out}
	if upstream {
		ea, err := stack.StartUpstreamAttacher(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		stops = append(stops, ea.Stop)
		w.attacher = ea.Scrape
		kcm, err := stack.StartKubeControllerManager(ctx, stack.KubeControllerManagerConfig{Kubeconfig: kubeconfig, LeaderElect: true, Output: out})
		if err != nil {
			t.Fatal(err)
		}
		stops = append(stops, kcm.Stop)
		w.ctrl = kcm.Scrape
		return w
	}
	start := func(pkg, endpoint string, args ...string) func(ctx context.Context) (testsupport.Samples, error) {
		c, err := stack.Process(ctx, pkg, out, testsupport.MustBinary(t, pkg), args...)
		if err != nil {
			t.Fatal(err)
		}
		stops = append(stops, c.Stop)
		url := "http://" + endpoint + "/metrics"
		testsupport.Eventually(t, ctx, time.Minute, pkg+" serving /metrics", func(ctx context.Context) (bool, error) {
			_, err := testsupport.Scrape(ctx, url)
			return err == nil, nil
		})
		return func(ctx context.Context) (testsupport.Samples, error) { return testsupport.Scrape(ctx, url) }
	}
	// The very flags the upstream attacher got.
	w.attacher = start("cmd/csi-attacher", attacherEndpoint, stack.UpstreamAttacherArgs(cfg)...)
	ctrlEndpoint := testsupport.FreeAddr(t)
	w.ctrl = start("cmd/attachdetach-controller", ctrlEndpoint, "--kubeconfig="+kubeconfig, "--http-endpoint="+ctrlEndpoint, "--leader-elect=true")
	return w
}

// attachThenDetach runs the scenario: a Pod's volume attached, then the Pod
// deleted and the volume detached. whileAttached runs in between (gauges
// of attached volumes are only there then).
func (w *mxWorld) attachThenDetach(t *testing.T, ctx context.Context, whileAttached func()) {
	t.Helper()
	const ns, vol, pod, node = "mx", "mx-vol", "mx-app", "mx-node"
	if err := localcluster.CreateNamespace(ctx, w.s.Client, ns); err != nil {
		t.Fatal(err)
	}
	w.runPod(t, ctx, ns, pod, node, vol)
	whileAttached()
	if err := w.s.Client.CoreV1().Pods(ns).Delete(ctx, pod, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	w.waitNoVolumeAttachment(t, ctx)
}

// runPod creates a bound volume vol of the driver and a Pod using it on
// node, and waits until the Pod runs.
func (w *mxWorld) runPod(t *testing.T, ctx context.Context, ns, pod, node, vol string) {
	t.Helper()
	if _, _, err := localcluster.CreateBoundVolume(ctx, w.s.Client, localcluster.VolumeSpec{Namespace: ns, Name: vol, Driver: mxDriver}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.s.Client.CoreV1().Pods(ns).Create(ctx, localcluster.NewPod(ns, pod, node, vol), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, ctx, 2*time.Minute, "Pod "+ns+"/"+pod+" running", func(ctx context.Context) (bool, error) {
		p, err := w.s.Client.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
		return err == nil && p.Status.Phase == v1.PodRunning, err
	})
}

func (w *mxWorld) waitNoVolumeAttachment(t *testing.T, ctx context.Context) {
	t.Helper()
	testsupport.Eventually(t, ctx, 2*time.Minute, "no VolumeAttachment left", func(ctx context.Context) (bool, error) {
		vas, err := w.s.Client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
		return err == nil && len(vas.Items) == 0, err
	})
}

// forcedDetach attaches a second Pod's volume, then the node goes down
// (kubelet stand-in stopped, NotReady: the volume stays in volumesInUse),
// the Pod is deleted (it stays terminating) and the node gets the
// out-of-service taint: the volume is detached at once, a forced detach.
// The kubelet stand-in stays stopped.
func (w *mxWorld) forcedDetach(t *testing.T, ctx context.Context) {
	t.Helper()
	const ns, vol, pod, node = "mx", "mx-vol-oos", "mx-app-oos", "mx-node"
	w.runPod(t, ctx, ns, pod, node, vol)
	if err := w.s.StopKubelet(); err != nil {
		t.Fatal(err)
	}
	if err := w.s.Kubelet.SetReady(ctx, node, false); err != nil {
		t.Fatal(err)
	}
	if err := w.s.Client.CoreV1().Pods(ns).Delete(ctx, pod, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := w.s.Kubelet.Taint(ctx, node, v1.Taint{Key: localcluster.OutOfServiceTaint, Value: "nodeshutdown", Effect: v1.TaintEffectNoExecute}); err != nil {
		t.Fatal(err)
	}
	w.waitNoVolumeAttachment(t, ctx)
}

// scrapeUntil scrapes until done says the scrape has what it waits for,
// or the timeout passes (then the last scrape is returned).
func scrapeUntil(t *testing.T, ctx context.Context, scrape func(context.Context) (testsupport.Samples, error), done func(testsupport.Samples) bool) testsupport.Samples {
	t.Helper()
	var last testsupport.Samples
	_ = testsupport.Poll(ctx, 30*time.Second, func(ctx context.Context) (bool, error) {
		s, err := scrape(ctx)
		if err != nil {
			return false, nil
		}
		last = s
		return done(s), nil
	})
	if last == nil {
		t.Fatal("no scrape succeeded")
	}
	return last
}

func hasDetachOps(s testsupport.Samples) bool {
	_, attach := s.Value("storage_operation_duration_seconds_count", map[string]string{"operation_name": "volume_attach"})
	_, detach := s.Value("storage_operation_duration_seconds_count", map[string]string{"operation_name": "volume_detach"})
	return attach && detach
}

func hasForcedDetach(s testsupport.Samples) bool {
	_, ok := s.Value("attach_detach_controller_attachdetach_controller_forced_detaches", map[string]string{"reason": "out-of-service"})
	return ok && hasDetachOps(s)
}

func hasAttachedGauges(s testsupport.Samples) bool {
	_, total := s.Value("attachdetach_controller_total_volumes", map[string]string{"state": "actual_state_of_world"})
	_, inUse := s.Value("storage_count_attachable_volumes_in_use", nil)
	return total && inUse
}

func hasUnpublish(s testsupport.Samples) bool {
	_, ok := s.Value("csi_sidecar_operations_seconds_count", map[string]string{"method_name": "/csi.v1.Controller/ControllerUnpublishVolume"})
	return ok
}

func TestMetrics_latchExposesEveryUpstreamMetricNameAndLabelSet(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	type scrapes struct{ attacher, ctrl testsupport.Samples }
	run := func(upstream bool) scrapes {
		w := mxStart(t, ctx, upstream)
		var attached testsupport.Samples
		w.attachThenDetach(t, ctx, func() {
			attached = scrapeUntil(t, ctx, w.ctrl, hasAttachedGauges)
		})
		w.forcedDetach(t, ctx)
		return scrapes{
			attacher: scrapeUntil(t, ctx, w.attacher, hasUnpublish),
			ctrl:     append(attached, scrapeUntil(t, ctx, w.ctrl, hasForcedDetach)...),
		}
	}
	up := run(true)
	ours := run(false)

	// The upstream side must have what the comparison is about, or the
	// test would pass on an empty scrape.
	upAttacher, upAttacherValues := mxLabelSets(up.attacher, mxKeepAttacher)
	upCtrl, upCtrlValues := mxLabelSets(up.ctrl, mxKeepKCM)
	for _, must := range []string{"csi_sidecar_operations_seconds_count", "workqueue_adds_total", "leader_election_master_status"} {
		if upAttacher[must] == nil {
			t.Fatalf("upstream external-attacher's /metrics has no %s: %v", must, slices.Sorted(maps.Keys(upAttacher)))
		}
	}
	for _, must := range []string{"storage_operation_duration_seconds_count", "attachdetach_controller_total_volumes", "storage_count_attachable_volumes_in_use", "leader_election_master_status", "attach_detach_controller_attachdetach_controller_forced_detaches", "rest_client_requests_total", "rest_client_rate_limiter_duration_seconds_count"} {
		if upCtrl[must] == nil {
			t.Fatalf("upstream kube-controller-manager's /metrics has no %s: %v", must, slices.Sorted(maps.Keys(upCtrl)))
		}
	}
	t.Logf("compared: external-attacher %v; kube-controller-manager %v", slices.Sorted(maps.Keys(upAttacher)), slices.Sorted(maps.Keys(upCtrl)))

	ourAttacher, ourAttacherValues := mxLabelSets(ours.attacher, mxKeepAttacher)
	for _, m := range mxMissing(upAttacher, ourAttacher) {
		t.Errorf("csi-attacher lacks external-attacher's %s", m)
	}
	// A difference by design (docs/metrics.md): the external-attacher
	// serves no API client metrics; latch's csi-attacher serves
	// kube-controller-manager's.
	upRESTClient := labelSets{}
	for name, sets := range upCtrl {
		if strings.HasPrefix(name, "rest_client_") {
			upRESTClient[name] = sets
			if upAttacher[name] != nil {
				t.Errorf("external-attacher serves %s now: docs/metrics.md calls it latch's addition", name)
			}
		}
	}
	for _, m := range mxMissing(upRESTClient, ourAttacher) {
		t.Errorf("csi-attacher lacks kube-controller-manager's %s", m)
	}
	ourCtrl, ourCtrlValues := mxLabelSets(ours.ctrl, mxKeepKCM)
	for _, m := range mxMissing(upCtrl, ourCtrl) {
		t.Errorf("attachdetach-controller lacks kube-controller-manager's %s", m)
	}

	// Dashboards select by these label values.
	for _, c := range []struct {
		who         string
		metric, lbl string
		upV, ourV   map[string]map[string]map[string]bool
		// ignore are values that depend on timing, not on the scenario.
		ignore []string
	}{
		{who: "csi-attacher", metric: "workqueue_adds_total", lbl: "name", upV: upAttacherValues, ourV: ourAttacherValues},
		// Upstream's ListVolumes reconcile runs at start, latch's first one
		// --reconcile-sync later (docs/metrics.md).
		{who: "csi-attacher", metric: "csi_sidecar_operations_seconds_count", lbl: "method_name", upV: upAttacherValues, ourV: ourAttacherValues, ignore: []string{"/csi.v1.Controller/ListVolumes"}},
		{who: "attachdetach-controller", metric: "storage_operation_duration_seconds_count", lbl: "operation_name", upV: upCtrlValues, ourV: ourCtrlValues},
		{who: "attachdetach-controller", metric: "storage_operation_duration_seconds_count", lbl: "volume_plugin", upV: upCtrlValues, ourV: ourCtrlValues},
		{who: "attachdetach-controller", metric: "storage_operation_duration_seconds_count", lbl: "status", upV: upCtrlValues, ourV: ourCtrlValues},
		{who: "attachdetach-controller", metric: "attachdetach_controller_total_volumes", lbl: "state", upV: upCtrlValues, ourV: ourCtrlValues},
		{who: "attachdetach-controller", metric: "attach_detach_controller_attachdetach_controller_forced_detaches", lbl: "reason", upV: upCtrlValues, ourV: ourCtrlValues},
		{who: "attachdetach-controller", metric: "attachdetach_controller_total_volumes", lbl: "plugin_name", upV: upCtrlValues, ourV: ourCtrlValues},
		// The buckets: a histogram_quantile over upstream's buckets reads
		// the same bounds in latch's.
		{who: "attachdetach-controller", metric: "storage_operation_duration_seconds_bucket", lbl: "le", upV: upCtrlValues, ourV: ourCtrlValues},
		{who: "csi-attacher", metric: "csi_sidecar_operations_seconds_bucket", lbl: "le", upV: upAttacherValues, ourV: ourAttacherValues},
	} {
		for _, v := range slices.Sorted(maps.Keys(c.upV[c.metric][c.lbl])) {
			if !c.ourV[c.metric][c.lbl][v] && !slices.Contains(c.ignore, v) {
				t.Errorf("%s: %s has no %s=%q (upstream's values %q, ours %q)", c.who, c.metric, c.lbl, v,
					slices.Sorted(maps.Keys(c.upV[c.metric][c.lbl])), slices.Sorted(maps.Keys(c.ourV[c.metric][c.lbl])))
			}
		}
	}
	if c := len(upCtrlValues["storage_operation_duration_seconds_bucket"]["le"]); c < 10 {
		t.Errorf("kube-controller-manager's storage_operation_duration_seconds has %d buckets, want its 0.1 s … 600 s", c)
	}

	// leader_election_master_status's name, by design not upstream's
	// (docs/metrics.md): the external-attacher's elector has none, latch's
	// csi-attacher names its Lease; kube-controller-manager and latch's
	// controller each name their own Lease.
	for _, c := range []struct {
		who    string
		values map[string]map[string]map[string]bool
		want   []string
	}{
		{"external-attacher", upAttacherValues, []string{""}},
		{"csi-attacher", ourAttacherValues, []string{"external-attacher-leader-metrics-csi-latch-test"}},
		{"kube-controller-manager", upCtrlValues, []string{"kube-controller-manager"}},
		{"attachdetach-controller", ourCtrlValues, []string{"latch-attachdetach-controller"}},
	} {
		got := slices.Sorted(maps.Keys(c.values["leader_election_master_status"]["name"]))
		if len(got) == 0 {
			got = []string{""} // an empty label value is no label in the scrape
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: leader_election_master_status name = %q, want %q", c.who, got, c.want)
		}
	}
}
