package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/testsupport"
)

// The small bench-peers run make test keeps: one round of latch's
// csi-attacher beside the upstream external-attacher (tuned) on every
// workload and backend profile, and latch's attachdetach-controller
// beside kube-controller-manager's. It checks that everything ran and
// latch's correctness counts, and that the JSON report is written; never
// a timing (the machine may be busy).
func TestBenchPeersSmallRoundRunsEveryContenderAndLatchAttachesEachVolumeWithOnePublish(t *testing.T) {
	if testing.Short() {
		t.Skip("starts upstream binaries")
	}
	dir, kubeconfig := peersWorkDir(t)
	attachers, controllers, skipped, err := PeerContenders(PeerContenderOptions{
		LatchAttacher:   testsupport.MustBinary(t, "cmd/csi-attacher"),
		LatchController: testsupport.MustBinary(t, "cmd/attachdetach-controller"),
		Upstream:        true, KCM: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(skipped) > 0 {
		t.Fatalf("skipped %v with no previous release asked for", skipped)
	}
	// upstream 10 runs only the backend profiles, as upstream tuned does
	// too: the small run keeps one upstream attacher.
	attachers = slices.DeleteFunc(attachers, func(a PeerAttacher) bool { return a.Name == "upstream 10" || a.Name == PeerLatchFixed })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var out bytes.Buffer
	// The small scale's sizes cut down further: the same workloads, each
	// backend profile included, on fewer objects (the small scale itself
	// is make bench-peers SCALE=small).
	sizes, err := PeerSizesFor(Small)
	if err != nil {
		t.Fatal(err)
	}
	sizes.Paced, sizes.Saturated, sizes.Pods = 8, 20, 6
	sizes.Backend = map[string]int{"slow-cloud": 4, "fast-san": 12, "throttling-api": 12}
	rep, err := RunPeers(ctx, PeersConfig{
		Cluster: cluster, Scale: Small, Sizes: sizes, Rounds: 1, Attachers: attachers, Controllers: controllers,
		Kubeconfig: kubeconfig, LogDir: dir, Out: &out,
	})
	rep.PrintTable(&out)
	t.Logf("\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range rep.Failed(false) {
		t.Error(f)
	}
	if got, want := len(rep.Runs), len(attachers)+len(controllers); got != want {
		t.Fatalf("%d runs, want one per contender (%d)", got, want)
	}
	sz := rep.Sizes
	for _, run := range rep.Runs {
		if !run.latch {
			continue
		}
		switch run.Kind {
		case "attacher":
			// Every VolumeAttachment of the paced and saturated
			// workloads attached with exactly one publish and gone,
			// and every backend profile's burst too.
			if got := run.Figures["publishes_per_va"]; got != 1 {
				t.Errorf("latch fixed: publishes per VolumeAttachment = %v, want 1.000", got)
			}
			want := []string{"VolumeAttachments attached", "VolumeAttachments gone after their delete", "ControllerPublish calls per VolumeAttachment", "no single-node volume on two nodes at once"}
			for _, p := range PeerBackendProfiles {
				want = append(want, p+": VolumeAttachments attached", p+": VolumeAttachments gone after their delete")
				if _, ok := run.Figures["backend_"+p+"_capacity_percent"]; !ok {
					t.Errorf("latch fixed: no share of %s's capacity (figures %v)", p, run.Figures)
				}
				if _, ok := run.Figures["backend_"+p+"_throttled_percent"]; !ok {
					t.Errorf("latch fixed: no throttled share for %s (figures %v)", p, run.Figures)
				}
			}
			checksNamed(t, run, want...)
			checkValue(t, run, "VolumeAttachments attached", itoa(sz.Paced+sz.Saturated))
		case "controller":
			checksNamed(t, run, "Pods' volumes in node status", "Pods Running", "VolumeAttachments gone after their Pod",
				"ControllerPublish calls per VolumeAttachment (latch's csi-attacher)", "no single-node volume on two nodes at once")
			checkValue(t, run, "VolumeAttachments gone after their Pod", itoa(sz.Pods))
		}
	}
	// The upstream contenders ran their workloads (their checks are
	// findings, not failures of the run).
	for _, name := range []string{"attacher/upstream tuned", "controller/kube-controller-manager"} {
		if rep.Medians[name] == nil || rep.Ratios[name] == nil {
			t.Errorf("no medians or ratios for %s: %v", name, rep.Medians)
		}
	}
	if !strings.Contains(out.String(), "Pod deleted → VA gone p99 ms") || !strings.Contains(out.String(), "attach p99 ms, saturated") {
		t.Errorf("the table lacks its rows:\n%s", out.String())
	}
	// Each run removed its objects: the next contender's caches hold only
	// its own.
	noPeerObjectsLeft(t, rep)
	path := DefaultPeersOut(filepath.Join(dir, "results"), rep.Scale, rep.Started)
	if err := rep.WriteJSON(path); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var back PeersReport
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Runs) != len(rep.Runs) || back.Medians["attacher/latch adaptive"]["publishes_per_va"] != 1 || !strings.HasPrefix(filepath.Base(path), "bench-peers-small-") {
		t.Errorf("JSON report %s: %d runs, medians %v", path, len(back.Runs), back.Medians["attacher/latch fixed"])
	}
}

// peersWorkDir is a test's directory for the contenders' logs, with the
// shared control plane's kubeconfig in it.
func peersWorkDir(t *testing.T) (dir, kubeconfig string) {
	t.Helper()
	dir = t.TempDir()
	kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := cluster.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	return dir, kubeconfig
}

// noPeerObjectsLeft fails when a run left a VolumeAttachment, PV, Node or
// CSINode of its own behind (their names, or drivers, start with "pa" or
// "pc", the round and the run's ID).
func noPeerObjectsLeft(t *testing.T, rep *PeersReport) {
	t.Helper()
	ctx := context.Background()
	client := cluster.Client()
	ours := func(name string) bool {
		return (strings.HasPrefix(name, "pa") || strings.HasPrefix(name, "pc")) && strings.Contains(name, "-"+rep.runID)
	}
	vas, err := client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, va := range vas.Items {
		if ours(va.Spec.Attacher) {
			t.Errorf("VolumeAttachment %s of %s left behind", va.Name, va.Spec.Attacher)
		}
	}
	pvs, err := client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, pv := range pvs.Items {
		if ours(pv.Name) {
			t.Errorf("PersistentVolume %s left behind", pv.Name)
		}
	}
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		if ours(n.Name) {
			t.Errorf("Node %s left behind", n.Name)
		}
	}
	csiNodes, err := client.StorageV1().CSINodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range csiNodes.Items {
		if ours(n.Name) {
			t.Errorf("CSINode %s left behind", n.Name)
		}
	}
}

func checksNamed(t *testing.T, run *PeerRun, names ...string) {
	t.Helper()
	for _, n := range names {
		if !slices.ContainsFunc(run.Checks, func(c Check) bool { return c.Name == n }) {
			t.Errorf("%s %s has no %q check (checks: %+v)", run.Kind, run.Contender, n, run.Checks)
		}
	}
}

func checkValue(t *testing.T, run *PeerRun, name, want string) {
	t.Helper()
	for _, c := range run.Checks {
		if c.Name == name && c.Value != want {
			t.Errorf("%s %s: %s = %s, want %s", run.Kind, run.Contender, name, c.Value, want)
		}
	}
}

func itoa(n int) string { return fmt.Sprint(n) }

func TestBenchPeersRoundsRotateTheOrderSoEachContenderRunsFirstOnce(t *testing.T) {
	list := []string{"a", "b", "c"}
	firsts := map[string]bool{}
	for round := range 3 {
		got := rotated(list, round)
		if len(got) != 3 || !slices.Contains(got, "a") || !slices.Contains(got, "b") || !slices.Contains(got, "c") {
			t.Fatalf("round %d order %v is not every contender once", round, got)
		}
		firsts[got[0]] = true
	}
	if len(firsts) != 3 {
		t.Errorf("first contenders over three rounds: %v, want each of a, b, c once", firsts)
	}
	if got := rotated(list, 4); !slices.Equal(got, []string{"b", "c", "a"}) {
		t.Errorf("round 5's order = %v, want [b c a]", got)
	}
}

func TestBenchPeersMediansAreOverRoundsAndRatiosAreAgainstLatch(t *testing.T) {
	rep := &PeersReport{}
	for i, v := range []float64{300, 100, 200} {
		rep.Runs = append(rep.Runs,
			&PeerRun{Round: i + 1, Kind: "attacher", Contender: PeerLatchAdaptive, Figures: map[string]float64{"attach_paced_p99_ms": v}},
			&PeerRun{Round: i + 1, Kind: "attacher", Contender: "upstream tuned", Figures: map[string]float64{"attach_paced_p99_ms": 4 * v}},
			&PeerRun{Round: i + 1, Kind: "controller", Contender: PeerLatchController, Figures: map[string]float64{"controller_cpu_s": v / 100}},
			&PeerRun{Round: i + 1, Kind: "controller", Contender: "kube-controller-manager", Figures: map[string]float64{"controller_cpu_s": v / 50}})
	}
	rep.summarize()
	if got := rep.Medians["attacher/latch adaptive"]["attach_paced_p99_ms"]; got != 200 {
		t.Errorf("latch adaptive's median = %v, want 200", got)
	}
	if got := rep.Ratios["attacher/upstream tuned"]["attach_paced_p99_ms"]; got != 4 {
		t.Errorf("upstream's ratio = %v, want 4", got)
	}
	if got := rep.Ratios["controller/kube-controller-manager"]["controller_cpu_s"]; got != 2 {
		t.Errorf("kcm's CPU ratio = %v, want 2 (against latch's controller, not the attacher)", got)
	}
	if _, ok := rep.Ratios["attacher/latch adaptive"]; ok {
		t.Errorf("the reference has a ratio to itself")
	}
	if got := median([]float64{1, 4, 2, 3}); got != 2.5 {
		t.Errorf("median of an even count = %v, want 2.5", got)
	}
}

func TestBenchPeersFailedListsOnlyThisCheckoutsFailuresUnlessAskedForAll(t *testing.T) {
	rep := &PeersReport{Runs: []*PeerRun{
		{Round: 1, Kind: "attacher", Contender: "upstream tuned", Checks: []Check{{Name: "x", Pass: false}}},
		{Round: 1, Kind: "attacher", Contender: PeerLatchAdaptive, latch: true, Checks: []Check{{Name: "y", Pass: true}}},
		{Round: 1, Kind: "controller", Contender: "latch v0.1.0", Checks: []Check{{Name: "z", Pass: false}}},
	}}
	if got := rep.Failed(false); len(got) != 0 {
		t.Errorf("Failed(false) = %v, want none (upstream's and the previous release's failed checks are findings)", got)
	}
	if got := rep.Failed(true); len(got) != 2 || !strings.Contains(got[0], "upstream tuned") || !strings.Contains(got[1], "latch v0.1.0") {
		t.Errorf("Failed(true) = %v, want upstream's and the previous release's checks", got)
	}
	rep.Runs[1].Checks[0].Pass = false
	if got := rep.Failed(false); len(got) != 1 || !strings.Contains(got[0], PeerLatchAdaptive) {
		t.Errorf("Failed(false) = %v, want latch fixed's failed check", got)
	}
	var out bytes.Buffer
	for _, run := range rep.Runs {
		printPeerRun(&out, run)
	}
	if got := out.String(); strings.Count(got, "FINDING") != 2 || strings.Count(got, "FAIL ") != 1 {
		t.Errorf("printed runs:\n%s\nwant two FINDING lines (upstream, previous release) and one FAIL (latch fixed)", got)
	}
}

func TestBenchPeersPacedCallsKeepTheirScheduleWhenCallsAreSlow(t *testing.T) {
	start := time.Now()
	var mu sync.Mutex
	var at []time.Duration
	err := paced(context.Background(), 5, 50, func(context.Context, int) error {
		mu.Lock()
		at = append(at, time.Since(start))
		mu.Unlock()
		time.Sleep(200 * time.Millisecond) // slower than the 20 ms between calls
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// An open arrival process: the fifth call starts about 80 ms in, not
	// after the four before it returned (800 ms).
	if len(at) != 5 || slices.Max(at) >= 600*time.Millisecond {
		t.Errorf("call starts %v, want all 5 within the schedule (the last about 80 ms in)", at)
	}
}

func TestBenchPeersPreviousReleaseMissingFromTheHistoryIsSkippedWithTheReason(t *testing.T) {
	attachers, controllers, skipped, err := PeerContenders(PeerContenderOptions{
		LatchAttacher: "/bin/latch-attacher", LatchController: "/bin/latch-controller",
		Previous: "v0.0.0-not-a-revision", PreviousName: "latch v0.0.0",
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(attachers) != 2 || attachers[0].Name != PeerLatchAdaptive || attachers[1].Name != PeerLatchFixed || len(controllers) != 1 || controllers[0].Name != PeerLatchController {
		t.Errorf("contenders %+v / %+v, want latch's alone", attachers, controllers)
	}
	if len(skipped) != 1 || !strings.Contains(skipped[0], "latch v0.0.0") || !strings.Contains(skipped[0], "v0.0.0-not-a-revision") || !strings.Contains(skipped[0], "not found") {
		t.Errorf("skipped = %q, want one line naming the release, its revision and that git does not have it", skipped)
	}
	var out bytes.Buffer
	(&PeersReport{Skipped: skipped}).PrintTable(&out)
	if !strings.Contains(out.String(), "SKIPPED latch v0.0.0") {
		t.Errorf("the table does not say what was skipped:\n%s", out.String())
	}
}

// A burst the contender does not serve within the backend budget is
// measured over the budget: its unfinished operations and failed checks
// are recorded, its share of capacity is over the budget's time, its
// VolumeAttachments are removed, and the run goes on. slow-cloud's calls
// take 2 s (σ 0.3): four attaches and their detaches cannot be done in
// one second.
func TestBenchPeersBurstNotServedWithinTheBackendBudgetIsMeasuredOverTheBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("starts csi-attacher")
	}
	dir, kubeconfig := peersWorkDir(t)
	attachers, _, _, err := PeerContenders(PeerContenderOptions{LatchAttacher: testsupport.MustBinary(t, "cmd/csi-attacher")})
	if err != nil {
		t.Fatal(err)
	}
	attachers = slices.DeleteFunc(attachers, func(a PeerAttacher) bool { return a.Name != PeerLatchAdaptive })
	attachers[0].Latency = false
	sizes, err := PeerSizesFor(Small)
	if err != nil {
		t.Fatal(err)
	}
	sizes.Backend = map[string]int{"slow-cloud": 4}
	sizes.BackendBudget = time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out bytes.Buffer
	rep, err := RunPeers(ctx, PeersConfig{
		Cluster: cluster, Scale: Small, Sizes: sizes, Rounds: 1, Attachers: attachers, Profiles: []string{"slow-cloud"},
		Kubeconfig: kubeconfig, LogDir: dir, Out: &out,
	})
	t.Logf("\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Runs) != 1 {
		t.Fatalf("%d runs, want 1", len(rep.Runs))
	}
	run := rep.Runs[0]
	if run.Error != "" {
		t.Errorf("run error %q: a burst over its budget is a measurement, not an error", run.Error)
	}
	if got := run.Figures["backend_slow-cloud_unfinished_ops"]; got < 1 || got > 8 {
		t.Errorf("unfinished operations = %v, want 1–8 of 8", got)
	}
	if got := run.Figures["backend_slow-cloud_wall_s"]; got != 1 {
		t.Errorf("wall time = %v s, want the budget's 1 s", got)
	}
	if _, ok := run.Figures["backend_slow-cloud_capacity_percent"]; !ok {
		t.Errorf("no share of capacity over the budget (figures %v)", run.Figures)
	}
	if _, ok := run.Figures["backend_slow-cloud_attach_p99_ms"]; ok && run.Figures["backend_slow-cloud_unfinished_ops"] > 4 {
		t.Errorf("an attach p99 over part of the burst (figures %v)", run.Figures)
	}
	failed := strings.Join(rep.Failed(false), "\n")
	if !strings.Contains(failed, "slow-cloud: VolumeAttachments gone after their delete") || !strings.Contains(failed, "target 4 within 1s") {
		t.Errorf("failed checks %q, want the gone check with target \"4 within 1s\"", failed)
	}
	if !strings.Contains(out.String(), "not done within 1s") || !strings.Contains(out.String(), "removing its VolumeAttachments") {
		t.Errorf("output does not say the burst was cut at the budget:\n%s", out.String())
	}
	noPeerObjectsLeft(t, rep)
}
