// Command latch-scale runs the scale scenario (issue 23, docs/scale.md) on
// a local control plane: every volume attached before the components
// start, then csi-attacher, latch's attachdetach-controller and
// kube-controller-manager's attach/detach controller cold-started one after
// another on the same objects, each followed by a trickle of Pods and a
// recovery burst (10% of the nodes fail). It prints latch beside
// kube-controller-manager and writes the figures as JSON.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/bench"
	"github.com/latchcsi/latch/internal/testsupport"
)

func main() { os.Exit(run(os.Args[1:])) }

func run(args []string) int {
	fs := flag.NewFlagSet("latch-scale", flag.ContinueOnError)
	size := fs.String("size", "small", "small (50 nodes, 500 volumes), medium (1,000 nodes, 10,000 volumes) or full (10,000 nodes, 100,000 volumes).")
	nodes := fs.Int("nodes", 0, "Override the size's node count.")
	volumes := fs.Int("volumes", 0, "Override the size's volume count.")
	creators := fs.Int("creators", 0, "Override the size's creates in flight.")
	window := fs.Duration("writes-window", 0, "Override how long after each start the components' writes are counted (the size's own: 10s small, 1m otherwise).")
	trickle := fs.Duration("trickle-window", 0, "Override how long the trickle (1 Pod created and 1 deleted per second) runs for each controller (the size's own: 10s small, 1m medium, 6m full).")
	maxEntries := fs.Int("max-entries", 500, "csi-attacher's --max-entries: the page size of the ListVolumes reconcile that is timed.")
	controllerFlags := fs.String("controller-flags", "", "Extra flags for latch's attachdetach-controller, separated by spaces (e.g. \"--node-status-workers=32\"); the report's notes name them.")
	noKCM := fs.Bool("no-kcm", false, "Leave kube-controller-manager out (its first build takes minutes).")
	out := fs.String("out", "bench/results", "Directory of the JSON report (latch-scale-<size>-<UTC>.json).")
	heapDir := fs.String("heap-profile", "", "Write heap profiles of this process (API server, etcd, harness) after the objects are created and at the end into this directory.")
	cpuDir := fs.String("cpu-profile", "", "Write a CPU profile of this process (API server, etcd, harness) while the objects are created into this directory (cpu-objects.pprof).")
	attMem := fs.Int("attacher-container-memory-mib", -1, "The container memory limit (MiB) of the second csi-attacher cold start, which gets 90% of it as GOMEMLIMIT as the binary takes from its container; -1: the size's own (512), 0: no second start.")
	memLimit := fs.Int("control-plane-memory-limit-mib", -1, "Soft memory limit of this process in MiB (Go's GOMEMLIMIT), which runs the API server, etcd and the harness; -1: the size's own (12288 full, none otherwise); 0 keeps Go's own (the GOMEMLIMIT environment variable, else none). The components are child processes and keep theirs.")
	workDir := fs.String("work-dir", "", "Directory for binaries, kubeconfig and logs; default: a new temporary directory (kept, its path is printed).")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	sz, err := bench.ScaleSizesFor(bench.ScaleSize(*size))
	if err != nil {
		fmt.Fprintln(os.Stderr, "latch-scale:", err)
		return 2
	}
	for _, o := range []struct {
		v   int
		dst *int
	}{{*nodes, &sz.Nodes}, {*volumes, &sz.Volumes}, {*creators, &sz.Creators}} {
		if o.v > 0 {
			*o.dst = o.v
		}
	}
	sz.MaxEntries = *maxEntries
	if *memLimit < -1 {
		fmt.Fprintln(os.Stderr, "latch-scale: --control-plane-memory-limit-mib must be -1 (the size's own), 0 (Go's own) or a size in MiB")
		return 2
	}
	if *memLimit == -1 {
		*memLimit = sz.ControlPlaneMemoryLimitMiB
	}
	if *memLimit > 0 {
		debug.SetMemoryLimit(int64(*memLimit) << 20)
	}
	if *attMem >= 0 {
		sz.AttacherContainerMemoryMiB = *attMem
	}
	if *window > 0 {
		sz.WritesWindow = *window
	}
	if *trickle > 0 {
		sz.TrickleWindow = *trickle
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	rep, err := scale(ctx, bench.ScaleSize(*size), sz, *workDir, *out, *heapDir, *cpuDir, !*noKCM, strings.Fields(*controllerFlags))
	if err != nil {
		fmt.Fprintln(os.Stderr, "latch-scale:", err)
		return 1
	}
	if failed := rep.Failed(); len(failed) > 0 {
		fmt.Fprintln(os.Stderr, "latch-scale: correctness failures:\n  "+strings.Join(failed, "\n  "))
		return 1
	}
	return 0
}

func scale(ctx context.Context, size bench.ScaleSize, sz bench.ScaleSizes, workDir, outDir, heapDir, cpuDir string, withKCM bool, controllerFlags []string) (*bench.ScaleReport, error) {
	workDir, err := bench.PrepareWorkDir(workDir, "latch-scale")
	if err != nil {
		return nil, err
	}
	logFile, err := os.Create(filepath.Join(workDir, "control-plane.log"))
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	if err := bench.LogTo(logFile, "0"); err != nil {
		return nil, err
	}
	defer klog.Flush()

	binDir := filepath.Join(workDir, "bin")
	if err := bench.BuildComponents(ctx, binDir, "./cmd/csi-attacher", "./cmd/attachdetach-controller"); err != nil {
		return nil, err
	}
	cfg := bench.ScaleConfig{
		Size: size, Sizes: sz, Out: os.Stdout, LogDir: workDir,
		AttacherBinary:   filepath.Join(binDir, "csi-attacher"),
		ControllerBinary: filepath.Join(binDir, "attachdetach-controller"),
		ControllerArgs:   controllerFlags,
		Kubeconfig:       filepath.Join(workDir, "kubeconfig"),
		HeapProfileDir:   heapDir,
		CPUProfileDir:    cpuDir,
	}
	if withKCM {
		fmt.Println("building kube-controller-manager v1.37.2 (minutes when the build cache is cold)")
		if cfg.KCMBinary, err = testsupport.UpstreamBinary("kube-controller-manager"); err != nil {
			return nil, err
		}
		defer testsupport.RemoveBinaries()
	}
	cluster, err := bench.StartControlPlane(ctx, workDir)
	if err != nil {
		return nil, err
	}
	defer cluster.Stop()
	if err := cluster.WriteKubeconfig(cfg.Kubeconfig); err != nil {
		return nil, err
	}
	cfg.Cluster = cluster
	started := time.Now()
	rep, runErr := bench.RunScale(klog.NewContext(ctx, klog.Background()), cfg)
	if rep == nil {
		return nil, runErr
	}
	rep.PrintTable(os.Stdout)
	path, err := rep.WriteJSON(outDir, size, started)
	if err != nil {
		return nil, errors.Join(runErr, err)
	}
	fmt.Printf("\nreport: %s\n", path)
	return rep, runErr
}
