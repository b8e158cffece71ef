package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/latchcsi/latch/internal/testsupport"
)

// TestScaleSmallColdStartsDetachNothingPublishNothingAttachedAndActFirst
// runs the scale scenario at the small size cut down further (scaleTestSizes:
// 10 nodes, 100 attached volumes, shorter windows; make bench-scale
// SIZE=small runs the small size itself) with csi-attacher, latch's attachdetach-controller and
// kube-controller-manager as child processes, and checks the invariants:
// nothing detached or unpublished, no ControllerPublish for an attached
// VolumeAttachment, the first action (a new VolumeAttachment attached, a
// Pod created at start attached) happens; in each controller's trickle
// every Pod's volume gets attached and every deleted Pod's detached; in
// each recovery burst (1 node fails, 10 volumes move) every moved volume
// is attached on its new node, its old VolumeAttachment is gone and no
// volume is ever attached to two nodes; and the JSON has every key. It
// asserts no timing: the figures go to the JSON and docs/scale.md.
func TestScaleSmallColdStartsDetachNothingPublishNothingAttachedAndActFirst(t *testing.T) {
	attacher := testsupport.MustBinary(t, "cmd/csi-attacher")
	controller := testsupport.MustBinary(t, "cmd/attachdetach-controller")
	kcm := testsupport.MustUpstreamBinary(t, "kube-controller-manager")
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := cluster.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var out bytes.Buffer
	sizes := scaleTestSizes(t)
	rep, err := RunScale(ctx, ScaleConfig{
		Cluster: cluster, Size: ScaleSmall, Sizes: sizes, Kubeconfig: kubeconfig,
		AttacherBinary: attacher, ControllerBinary: controller, KCMBinary: kcm,
		LogDir: dir, Cleanup: true, Out: &out,
	})
	if rep != nil {
		rep.PrintTable(&out)
	}
	t.Logf("\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range rep.Failed() {
		t.Error(f)
	}
	if len(rep.Checks) < 10 {
		t.Errorf("only %d checks ran: %+v", len(rep.Checks), rep.Checks)
	}
	if n := rep.Figures["attacher_publishes_at_start"]; n != 0 {
		t.Errorf("attacher_publishes_at_start = %v, want 0", n)
	}
	path, err := rep.WriteJSON(dir, ScaleSmall, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	measured := map[string]bool{
		"nodes": true, "volumes": true, "controller_ready_s": true, "controller_first_action_s": true,
		"controller_peak_rss_mb": true, "controller_writes_first_minute": true, "controller_idle_cpu_percent": true,
		"attacher_ready_s": true, "attacher_peak_rss_mb": true, "attacher_publishes_at_start": true,
		"listvolumes_reconcile_wall_s": true, "listvolumes_reconcile_cpu_s": true,
		"controller_trickle_cpu_percent": true, "controller_trickle_rss_mb": true, "trickle_api_requests_per_minute": true,
		"trickle_attach_p50_s": true, "trickle_attach_p99_s": true,
		"recovery_p50_s": true, "recovery_p99_s": true, "recovery_double_attached": true, "recovery_volumes": true,
	}
	for _, k := range ScaleRequiredKeys {
		names := []string{k.Name}
		if k.KCM {
			names = append(names, "kcm_"+k.Name)
		}
		for _, name := range names {
			v, ok := got[name]
			if !ok {
				t.Errorf("%s has no key %q", path, name)
				continue
			}
			base := name
			if len(name) > 4 && name[:4] == "kcm_" {
				base = name[4:]
			}
			if measured[base] && v == nil {
				t.Errorf("%s: %q is null, want a measured figure", path, name)
			}
		}
	}
	for _, k := range []string{"recovery_double_attached", "kcm_recovery_double_attached"} {
		if v, ok := got[k].(float64); !ok || v != 0 {
			t.Errorf("%s = %v, want 0", k, got[k])
		}
	}
	// 10% of the nodes fail in each burst, with their volumes: 1 of 10,
	// with 10 of the 100.
	for _, k := range []string{"recovery_volumes", "kcm_recovery_volumes"} {
		if v, _ := got[k].(float64); v != float64(sizes.Volumes/10) {
			t.Errorf("%s = %v, want %d", k, got[k], sizes.Volumes/10)
		}
	}
	// The second csi-attacher start ran as in a 512 MiB container: it
	// took 90% of it as Go's memory limit, and its figures are reported.
	if v, _ := got["attacher_limited_gomemlimit_mib"].(float64); v != 460 {
		t.Errorf("attacher_limited_gomemlimit_mib = %v, want 460", got["attacher_limited_gomemlimit_mib"])
	}
	for _, k := range []string{"attacher_limited_ready_s", "attacher_limited_peak_rss_mb"} {
		if v, _ := got[k].(float64); v <= 0 {
			t.Errorf("%s = %v, want a measured figure", k, got[k])
		}
	}
	limitedLog, err := os.ReadFile(filepath.Join(dir, "csi-attacher-limited.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(limitedLog, []byte("Go memory limit from GOMEMLIMIT")) || !bytes.Contains(limitedLog, []byte("460MiB")) {
		t.Errorf("the memory-limited csi-attacher did not log its GOMEMLIMIT of 460MiB:\n%s", testsupport.LastLines(string(limitedLog), 20))
	}
	// Its collections are told apart (gctrace), for latch's controller and
	// for kube-controller-manager.
	for _, k := range []string{"controller_idle_gcs", "kcm_controller_idle_gcs", "controller_idle_gc_cpu_percent"} {
		if _, ok := got[k].(float64); !ok {
			t.Errorf("%s = %v, want a number", k, got[k])
		}
	}
	if v, _ := got["nodes"].(float64); v != float64(sizes.Nodes) {
		t.Errorf("nodes = %v, want %d", got["nodes"], sizes.Nodes)
	}
	if v, _ := got["volumes"].(float64); v != float64(sizes.Volumes) {
		t.Errorf("volumes = %v, want %d", got["volumes"], sizes.Volumes)
	}
}

// scaleTestSizes are the small size's with a fifth of its objects and
// shorter windows: every phase of the run (cold starts, the memory-limited
// csi-attacher, the ListVolumes reconcile, idle, the trickles and the
// recovery bursts, kube-controller-manager included) runs and is checked
// as at the small size.
func scaleTestSizes(t *testing.T) ScaleSizes {
	t.Helper()
	sz, err := ScaleSizesFor(ScaleSmall)
	if err != nil {
		t.Fatal(err)
	}
	sz.Nodes, sz.Volumes = 10, 100
	sz.WritesWindow, sz.IdleWindow, sz.TrickleWindow = 2*time.Second, time.Second, 3*time.Second
	return sz
}
