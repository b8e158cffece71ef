// Command latch-bench-peers runs latch's csi-attacher and
// attachdetach-controller beside the upstream external-attacher and
// kube-controller-manager and latch's previous release on one local
// control plane, in interleaved rounds, and prints the medians and their
// ratios to latch's (docs/performance.md, "Against upstream: make
// bench-peers"). The JSON report keeps every round's figures.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/bench"
	"github.com/latchcsi/latch/internal/testsupport"
)

// defaultPrevious is latch v0.1.0 (the Makefile's UPGRADE_FROM).
const defaultPrevious = "0c7ab01"

type options struct {
	scale, previous, previousName, outDir, workDir, profiles string
	workloads                                                string
	rounds                                                   int
	backendBudget                                            time.Duration
	backendSeed                                              uint64
	noUpstream, noKCM, fixedLatency                          bool
}

func main() { os.Exit(run(os.Args[1:])) }

func parse(args []string) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("latch-bench-peers", flag.ContinueOnError)
	fs.StringVar(&o.scale, "scale", "full", "small (a couple of minutes) or full (the sizes the issue's targets are defined for).")
	fs.IntVar(&o.rounds, "rounds", 3, "Interleaved rounds: each runs every contender once, in an order rotated from round to round; medians are taken over the rounds.")
	fs.StringVar(&o.previous, "previous", defaultPrevious, "Git revision of latch's previous release, built from this checkout's history (empty: leave it out).")
	fs.StringVar(&o.previousName, "previous-name", "", "The previous release's name in the report (default: \"latch v0.1.0\" for the default revision, else \"latch <revision>\").")
	fs.StringVar(&o.profiles, "profiles", strings.Join(bench.PeerBackendProfiles, ","), "Comma-separated backend profiles of the mock driver for the throughput workload (empty: none).")
	fs.StringVar(&o.workloads, "workloads", "latency,backends,controllers", "Comma-separated workloads to run: latency (the attachers' paced and saturating bursts), backends (the attachers' bursts per backend profile), controllers (Pods through the A/D controllers).")
	fs.DurationVar(&o.backendBudget, "backend-budget", 0, "Time one backend profile's burst may take, attaches and detaches together; a contender that has not served it by then is measured over the budget and the next profile begins (0: the scale's, 5m at full, 2m at small).")
	fs.Uint64Var(&o.backendSeed, "backend-seed", 0, "Seed of the backend profiles' latency samples (0: the mock driver's, the same in every run): another seed is another draw of the same profiles.")
	fs.BoolVar(&o.noUpstream, "no-upstream", false, "Leave the upstream external-attacher out.")
	fs.BoolVar(&o.noKCM, "no-kcm", false, "Leave kube-controller-manager out.")
	fs.BoolVar(&o.fixedLatency, "fixed-latency", false, "Run latch fixed (--driver-concurrency=fixed) in the latency workload too, not only on the backend profiles: to compare the fixed limit with a previous release that had one.")
	fs.StringVar(&o.outDir, "out-dir", filepath.Join("bench", "results"), "Directory of the JSON report (bench-peers-<scale>-<UTC time>.json).")
	fs.StringVar(&o.workDir, "work-dir", "", "Directory for binaries, kubeconfig and logs; default: a new temporary directory (kept, its path is printed).")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if o.rounds < 1 {
		return nil, fmt.Errorf("--rounds must be at least 1, got %d", o.rounds)
	}
	if _, err := bench.PeerSizesFor(bench.Scale(o.scale)); err != nil {
		return nil, err
	}
	if o.backendBudget < 0 {
		return nil, fmt.Errorf("--backend-budget must not be negative, got %s", o.backendBudget)
	}
	for _, w := range strings.Split(o.workloads, ",") {
		switch strings.TrimSpace(w) {
		case "latency", "backends", "controllers":
		default:
			return nil, fmt.Errorf("--workloads: unknown workload %q (known: latency, backends, controllers)", w)
		}
	}
	ws := map[string]bool{}
	for _, w := range strings.Split(o.workloads, ",") {
		ws[strings.TrimSpace(w)] = true
	}
	if !ws["latency"] && !ws["controllers"] {
		// The previous release runs only those.
		o.previous = ""
	}
	o.noKCM = o.noKCM || !ws["controllers"]
	o.noUpstream = o.noUpstream || !(ws["latency"] || ws["backends"])
	if o.previousName == "" && o.previous == defaultPrevious {
		o.previousName = "latch v0.1.0"
	}
	return o, nil
}

func run(args []string) int {
	o, err := parse(args)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "latch-bench-peers:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	rep, err := peers(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "latch-bench-peers:", err)
		return 1
	}
	if failed := rep.Failed(false); len(failed) > 0 {
		fmt.Fprintln(os.Stderr, "latch-bench-peers: correctness failures of latch:\n  "+strings.Join(failed, "\n  "))
		return 1
	}
	return 0
}

func peers(ctx context.Context, o *options) (*bench.PeersReport, error) {
	dir, err := bench.PrepareWorkDir(o.workDir, "latch-bench-peers")
	if err != nil {
		return nil, err
	}
	logFile, err := os.Create(filepath.Join(dir, "control-plane.log"))
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	if err := bench.LogTo(logFile, "0"); err != nil {
		return nil, err
	}
	defer klog.Flush()

	binDir := filepath.Join(dir, "bin")
	if err := bench.BuildComponents(ctx, binDir, "./cmd/csi-attacher", "./cmd/attachdetach-controller"); err != nil {
		return nil, err
	}
	if o.previous != "" {
		name := o.previousName
		if name == "" {
			name = "latch " + o.previous
		}
		fmt.Printf("building %s from git revision %s as a release is built (static, -tags grpcnotrace; the first time: a minute or more)\n", name, o.previous)
	}
	if !o.noUpstream || !o.noKCM {
		fmt.Println("building the upstream external-attacher v4.13 and kube-controller-manager v1.37.2 (minutes when the build cache is cold)")
	}
	attachers, controllers, skipped, err := bench.PeerContenders(bench.PeerContenderOptions{
		LatchAttacher: filepath.Join(binDir, "csi-attacher"), LatchController: filepath.Join(binDir, "attachdetach-controller"),
		Previous: o.previous, PreviousName: o.previousName,
		Upstream: !o.noUpstream, KCM: !o.noKCM, FixedLatency: o.fixedLatency,
	})
	defer testsupport.RemoveBinaries()
	if err != nil {
		return nil, err
	}
	attachers, controllers = bench.PeerWorkloads(attachers, controllers, strings.Split(o.workloads, ","))
	cluster, err := bench.StartControlPlane(ctx, dir)
	if err != nil {
		return nil, err
	}
	defer cluster.Stop()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := cluster.WriteKubeconfig(kubeconfig); err != nil {
		return nil, err
	}
	var profiles []string
	for _, p := range strings.Split(o.profiles, ",") {
		if p = strings.TrimSpace(p); p != "" {
			profiles = append(profiles, p)
		}
	}
	if profiles == nil {
		profiles = []string{}
	}
	sizes, err := bench.PeerSizesFor(bench.Scale(o.scale))
	if err != nil {
		return nil, err
	}
	if o.backendBudget > 0 {
		sizes.BackendBudget = o.backendBudget
	}
	sizes.BackendSeed = o.backendSeed
	rep, runErr := bench.RunPeers(klog.NewContext(ctx, klog.Background()), bench.PeersConfig{
		Cluster: cluster, Scale: bench.Scale(o.scale), Sizes: sizes, Rounds: o.rounds,
		Attachers: attachers, Controllers: controllers, Profiles: profiles, Skipped: skipped,
		Kubeconfig: kubeconfig, LogDir: dir, Out: os.Stdout,
	})
	if rep == nil {
		return nil, runErr
	}
	rep.PrintTable(os.Stdout)
	path := bench.DefaultPeersOut(o.outDir, rep.Scale, rep.Started)
	if err := rep.WriteJSON(path); err != nil {
		return nil, errors.Join(runErr, err)
	}
	fmt.Printf("\nreport: %s\n", path)
	return rep, runErr
}
