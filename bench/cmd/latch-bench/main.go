// Command latch-bench runs latch's benchmarks (scenarios A–F of
// docs/performance.md) on a local control plane and prints a table, PASS/FAIL
// lines for the targets, and writes the figures as JSON.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/bench"
	"github.com/latchcsi/latch/internal/localcluster"
)

type options struct {
	scale           string
	scenarios       string
	profileDir      string
	out             string
	attacherBinary  string
	attacherFlags   string
	controllerFlags string
	inProcess       bool
	driverLatency   time.Duration
	workDir         string
	verbosity       string
	podCreators     int
	vaCreators      int
	controlPlaneGC  int
	controlPlaneMiB int
}

func main() { os.Exit(run(os.Args[1:])) }

// defaultControlPlaneGOGC and defaultControlPlaneMemoryLimitMiB leave the
// collector of this process, which runs the API server and etcd, as Go
// sets it (GOGC 100 unless the environment says otherwise), as every
// published run was measured. Their shared heap grows through a run with
// what the scenarios leave (watch caches, etcd's history, A's PVs), and
// with it the collector's share of the two cores, so limit probes late in
// a run read lower than F's; --control-plane-gogc=400 with a memory limit
// of 8192 MiB removes that, and lowers A's share of the limit
// (docs/performance.md, "What was changed for performance").
const (
	defaultControlPlaneGOGC           = 0
	defaultControlPlaneMemoryLimitMiB = 0
)

func parse(args []string) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("latch-bench", flag.ContinueOnError)
	fs.StringVar(&o.scale, "scale", "full", "small (a quick sanity run) or full (the sizes the targets are defined for).")
	fs.StringVar(&o.scenarios, "scenarios", strings.Join(bench.AllScenarios, ","), "Comma-separated scenarios to run (A–F); they always run in the order F,A,B,D,E,C.")
	fs.StringVar(&o.profileDir, "profile", "", "Write a CPU and a heap profile per scenario into this directory; the components then run inside the benchmark process (pprof label component=<name>).")
	fs.StringVar(&o.out, "out", "", "JSON report path; default bench/results/latch-bench-<scale>-<UTC time>.json.")
	fs.StringVar(&o.attacherBinary, "attacher-binary", "", "Run this external-attacher-compatible binary as csi-attacher (given --csi-address and --kubeconfig only); default: build ./cmd/csi-attacher.")
	fs.StringVar(&o.attacherFlags, "attacher-flags", "", "Extra flags for the csi-attacher child process, space-separated (e.g. \"--worker-threads=50\"); default flags otherwise.")
	fs.StringVar(&o.controllerFlags, "controller-flags", "", "Extra flags for the attachdetach-controller child process, space-separated (e.g. \"--concurrent-attach-detach-syncs=100\").")
	fs.BoolVar(&o.inProcess, "in-process", false, "Run csi-attacher and attachdetach-controller as goroutines of the benchmark (no CPU or memory figures).")
	fs.DurationVar(&o.driverLatency, "driver-latency", 20*time.Millisecond, "Latency of the mock driver's ControllerPublish and ControllerUnpublish.")
	fs.StringVar(&o.workDir, "work-dir", "", "Directory for binaries, kubeconfig and logs; default: a new temporary directory (kept, its path is printed).")
	fs.IntVar(&o.podCreators, "pod-creators", 0, "Pod creates and deletes D's harness keeps in flight; 0 means the scale's own (24 full, 8 small).")
	fs.IntVar(&o.vaCreators, "va-creators", 0, "VolumeAttachment creates and deletes A's harness keeps in flight; 0 means the scale's own (24 full, 8 small).")
	fs.IntVar(&o.controlPlaneGC, "control-plane-gogc", defaultControlPlaneGOGC, "GOGC of this process, which runs the API server and etcd (and, with --profile or --in-process, the components); 0 keeps Go's own setting (the GOGC environment variable, else 100). Child processes keep theirs.")
	fs.IntVar(&o.controlPlaneMiB, "control-plane-memory-limit-mib", defaultControlPlaneMemoryLimitMiB, "Soft memory limit of this process in MiB (Go's GOMEMLIMIT): past it the collector runs more often whatever --control-plane-gogc says; 0 keeps Go's own (the GOMEMLIMIT environment variable, else none).")
	fs.StringVar(&o.verbosity, "v", "0", "Log verbosity of the API server and in-process components (their logs go to a file in the work directory).")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	for _, c := range []struct {
		flag string
		n    int
	}{{"--pod-creators", o.podCreators}, {"--va-creators", o.vaCreators}, {"--control-plane-gogc", o.controlPlaneGC}, {"--control-plane-memory-limit-mib", o.controlPlaneMiB}} {
		if c.n < 0 {
			return nil, fmt.Errorf("%s must not be negative, got %d", c.flag, c.n)
		}
	}
	if (o.profileDir != "" || o.inProcess) && (o.attacherBinary != "" || o.attacherFlags != "" || o.controllerFlags != "") {
		return nil, errors.New("--profile and --in-process run latch's components in process: they cannot be combined with --attacher-binary, --attacher-flags or --controller-flags")
	}
	return o, nil
}

func run(args []string) int {
	o, err := parse(args)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "latch-bench:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	rep, err := benchmark(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "latch-bench:", err)
		return 1
	}
	if failed := rep.Failed(true); len(failed) > 0 {
		fmt.Fprintln(os.Stderr, "latch-bench: correctness failures:\n  "+strings.Join(failed, "\n  "))
		return 1
	}
	return 0
}

func benchmark(ctx context.Context, o *options) (*bench.Report, error) {
	dir, err := bench.PrepareWorkDir(o.workDir, "latch-bench")
	if err != nil {
		return nil, err
	}
	o.workDir = dir
	closeLog, err := logToFile(filepath.Join(o.workDir, "latch-bench.log"), o.verbosity)
	if err != nil {
		return nil, err
	}
	defer closeLog()

	if o.controlPlaneGC > 0 {
		debug.SetGCPercent(o.controlPlaneGC)
	}
	if o.controlPlaneMiB > 0 {
		debug.SetMemoryLimit(int64(o.controlPlaneMiB) << 20)
	}

	cluster, err := bench.StartControlPlane(ctx, o.workDir)
	if err != nil {
		return nil, err
	}
	defer cluster.Stop()
	ctx = klog.NewContext(ctx, klog.Background())

	cfg := bench.Config{
		Cluster: cluster, Scale: bench.Scale(o.scale), DriverLatency: o.driverLatency, Out: os.Stdout,
	}
	if o.scenarios != "" {
		cfg.Scenarios = strings.Split(o.scenarios, ",")
	}
	if o.podCreators > 0 || o.vaCreators > 0 {
		sz, err := bench.SizesFor(cfg.Scale)
		if err != nil {
			return nil, err
		}
		if o.podCreators > 0 {
			sz.PodsCreators = o.podCreators
		}
		if o.vaCreators > 0 {
			sz.AttachCreators = o.vaCreators
		}
		cfg.Sizes = sz
	}
	switch {
	case o.inProcess || o.profileDir != "":
		cfg.Launcher, cfg.Attacher = &bench.InProcess{RESTConfig: cluster.RESTConfig()}, "latch csi-attacher (in process)"
	default:
		procs, err := childProcesses(ctx, o, cluster)
		if err != nil {
			return nil, err
		}
		cfg.Launcher, cfg.Attacher = procs, procs.AttacherBinary
		if o.attacherBinary == "" {
			cfg.Attacher = "latch csi-attacher"
		}
		if o.attacherFlags != "" {
			cfg.Attacher += " " + o.attacherFlags
		}
		cfg.ControllerFlags = o.controllerFlags
	}
	if o.profileDir != "" {
		if err := os.MkdirAll(o.profileDir, 0o755); err != nil {
			return nil, err
		}
		cfg.AroundScenario = profiler(o.profileDir)
	}

	rep, err := bench.Run(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if o.out == "" {
		o.out = filepath.Join("bench", "results", fmt.Sprintf("latch-bench-%s-%s.json", o.scale, rep.Started.Format("20060102T150405Z")))
	}
	if err := writeJSON(o.out, rep); err != nil {
		return nil, err
	}
	fmt.Printf("\nreport: %s\n", o.out)
	if o.profileDir != "" {
		fmt.Printf("profiles: %s (go tool pprof -tagfocus component=csi-attacher ...)\n", o.profileDir)
	}
	return rep, nil
}

// childProcesses builds the controllers (unless an attacher binary is
// given) into the work directory and writes a kubeconfig for them.
func childProcesses(ctx context.Context, o *options, cluster *localcluster.Cluster) (*bench.Processes, error) {
	binDir := filepath.Join(o.workDir, "bin")
	pkgs := []string{"./cmd/attachdetach-controller"}
	if o.attacherBinary == "" {
		pkgs = append(pkgs, "./cmd/csi-attacher")
	}
	if err := bench.BuildComponents(ctx, binDir, pkgs...); err != nil {
		return nil, err
	}
	p := &bench.Processes{
		AttacherBinary:   o.attacherBinary,
		ControllerBinary: filepath.Join(binDir, "attachdetach-controller"),
		Kubeconfig:       filepath.Join(o.workDir, "kubeconfig"),
		LogDir:           o.workDir,
		AttacherArgs:     strings.Fields(o.attacherFlags),
		ControllerArgs:   strings.Fields(o.controllerFlags),
	}
	if p.AttacherBinary == "" {
		p.AttacherBinary = filepath.Join(binDir, "csi-attacher")
	}
	if abs, err := filepath.Abs(p.AttacherBinary); err == nil {
		p.AttacherBinary = abs
	}
	return p, cluster.WriteKubeconfig(p.Kubeconfig)
}

// profiler writes cpu-<scenario>.pprof over each scenario and
// heap-<scenario>.pprof at its end.
func profiler(dir string) func(string) func() {
	return func(scenario string) func() {
		cpu, err := os.Create(filepath.Join(dir, "cpu-"+scenario+".pprof"))
		if err != nil {
			fmt.Fprintln(os.Stderr, "latch-bench: profile:", err)
			return func() {}
		}
		if err := pprof.StartCPUProfile(cpu); err != nil {
			fmt.Fprintln(os.Stderr, "latch-bench: profile:", err)
			cpu.Close()
			return func() {}
		}
		return func() {
			pprof.StopCPUProfile()
			cpu.Close()
			runtime.GC()
			heap, err := os.Create(filepath.Join(dir, "heap-"+scenario+".pprof"))
			if err != nil {
				fmt.Fprintln(os.Stderr, "latch-bench: profile:", err)
				return
			}
			defer heap.Close()
			if err := pprof.WriteHeapProfile(heap); err != nil {
				fmt.Fprintln(os.Stderr, "latch-bench: profile:", err)
			}
		}
	}
}

func writeJSON(path string, rep *bench.Report) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	data, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

// logToFile sends klog (the API server and in-process components) to path.
func logToFile(path, verbosity string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open log file: %w", err)
	}
	if err := bench.LogTo(f, verbosity); err != nil {
		f.Close()
		return nil, err
	}
	return func() { klog.Flush(); f.Close() }, nil
}
