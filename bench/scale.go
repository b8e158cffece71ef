package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/latchcsi/latch/internal/localcluster"
)

// The scale scenario (issue 23, docs/scale.md): a cluster of many nodes
// and volumes, every volume already attached (node status and
// VolumeAttachment), on which csi-attacher, latch's
// attachdetach-controller and kube-controller-manager's attach/detach
// controller are cold-started one after another and measured on the same
// objects.

// ScaleSize names a scale run's size.
type ScaleSize string

const (
	ScaleSmall  ScaleSize = "small"
	ScaleMedium ScaleSize = "medium"
	ScaleFull   ScaleSize = "full"
)

// ScaleSizes are a scale run's object counts and windows.
type ScaleSizes struct {
	Nodes   int `json:"nodes"`
	Volumes int `json:"volumes"` // PVC/PV pairs, Pods and VolumeAttachments, one volume per Pod
	// Creators are the harness's creates in flight.
	Creators int `json:"creators"`
	// WritesWindow is how long after a start the components' API writes
	// are counted (the "first minute"; shorter for small runs).
	WritesWindow time.Duration `json:"writesWindow"`
	// MaxEntries is csi-attacher's --max-entries, the page size of its
	// ListVolumes reconcile (0: 500).
	MaxEntries int `json:"maxEntries"`
	// IdleWindow is how long each controller's idle CPU and API requests
	// are measured, after its writes window, with nothing changing.
	IdleWindow time.Duration `json:"idleWindow"`
	// TrickleWindow is how long the trickle (one Pod created and one
	// deleted per second) runs for each controller, after its idle window.
	TrickleWindow time.Duration `json:"trickleWindow"`
	// ActionTimeout bounds each wait for a first action.
	ActionTimeout time.Duration `json:"actionTimeout"`
	// ControlPlaneMemoryLimitMiB is the soft memory limit latch-scale sets
	// on its own process (API server, etcd, harness; 0: none). At the full
	// size the control plane's live heap is ~9 GB, and Go's default
	// headroom (GOGC=100) would double it past what a 24 GiB machine has
	// beside kube-controller-manager (docs/scale.md).
	ControlPlaneMemoryLimitMiB int `json:"controlPlaneMemoryLimitMiB"`
	// AttacherContainerMemoryMiB is the container memory limit the
	// second csi-attacher cold start runs as if under (0: no second
	// start): csi-attacher takes app.MemoryLimitRatio of it as Go's soft
	// memory limit, as deployed.
	AttacherContainerMemoryMiB int `json:"attacherContainerMemoryMiB"`
}

// ScaleSizesFor returns the sizes of a named size.
func ScaleSizesFor(s ScaleSize) (ScaleSizes, error) {
	switch s {
	case ScaleSmall:
		return ScaleSizes{Nodes: 50, Volumes: 500, Creators: 32, WritesWindow: 5 * time.Second, IdleWindow: 5 * time.Second, TrickleWindow: 10 * time.Second, ActionTimeout: time.Minute, AttacherContainerMemoryMiB: 512}, nil
	case ScaleMedium:
		return ScaleSizes{Nodes: 1000, Volumes: 10000, Creators: 64, WritesWindow: time.Minute, IdleWindow: time.Minute, TrickleWindow: time.Minute, ActionTimeout: 5 * time.Minute, AttacherContainerMemoryMiB: 512}, nil
	case ScaleFull:
		// Eight minutes of steady state per controller, two of them idle
		// and six with the trickle: with the ten (eight of
		// trickle) the first full run took 45 min 20 s on a 2-core
		// machine, with nine (seven) the second 45 min 58 s, its objects
		// alone 13 min 20 s and 14 min 50 s (docs/scale.md).
		return ScaleSizes{Nodes: 10000, Volumes: 100000, Creators: 96, WritesWindow: time.Minute, IdleWindow: 2 * time.Minute, TrickleWindow: 6 * time.Minute, ActionTimeout: 10 * time.Minute, ControlPlaneMemoryLimitMiB: 12 << 10, AttacherContainerMemoryMiB: 512}, nil
	}
	return ScaleSizes{}, fmt.Errorf("unknown scale size %q (want small, medium or full)", s)
}

// ScaleConfig is one scale run.
type ScaleConfig struct {
	Cluster *localcluster.Cluster
	Size    ScaleSize
	Sizes   ScaleSizes // zero: ScaleSizesFor(Size)
	// Kubeconfig is a kubeconfig file of Cluster for the child processes.
	Kubeconfig string
	// AttacherBinary and ControllerBinary are latch's csi-attacher and
	// attachdetach-controller; KCMBinary is kube-controller-manager
	// (empty: kube-controller-manager is not measured).
	AttacherBinary, ControllerBinary, KCMBinary string
	// ControllerArgs are extra flags for latch's attachdetach-controller,
	// after the harness's own (controllerArgs): a run with other worker
	// counts, for example. The report's notes name them.
	ControllerArgs []string
	// LogDir receives each child's output.
	LogDir string
	// Cleanup deletes every object of the run at the end (for a shared
	// control plane).
	Cleanup bool
	Out     io.Writer
	RunID   string
	// HeapProfileDir, when set, receives a heap profile of this process
	// (the API server, etcd and the harness) after the objects are created
	// and at the end of the run: heap-objects.pprof, heap-end.pprof.
	HeapProfileDir string
	// CPUProfileDir, when set, receives a CPU profile of this process
	// while the objects are created: cpu-objects.pprof.
	CPUProfileDir string
}

// ScaleReport is one scale run: the top-level figures (nil: not
// measured by this run) plus the checks.
type ScaleReport struct {
	Figures map[string]any
	Checks  []Check
	// Notes say what was not measured and why.
	Notes []string
}

// ScaleRequiredKeys are the top-level JSON names; those marked
// kcm also appear with the kcm_ prefix.
var ScaleRequiredKeys = []struct {
	Name string
	KCM  bool
}{
	{"nodes", false}, {"volumes", false},
	{"controller_ready_s", true}, {"controller_first_action_s", true}, {"controller_peak_rss_mb", true},
	{"controller_idle_cpu_percent", true}, {"controller_writes_first_minute", true},
	{"recovery_p99_s", true}, {"recovery_double_attached", true},
	{"recovery_p50_s", true}, {"recovery_volumes", true},
	{"controller_trickle_cpu_percent", true}, {"controller_trickle_rss_mb", true}, {"trickle_api_requests_per_minute", true},
	{"trickle_attach_p50_s", true}, {"trickle_attach_p99_s", true},
	{"attacher_ready_s", false}, {"attacher_peak_rss_mb", false}, {"attacher_publishes_at_start", false},
	{"listvolumes_reconcile_wall_s", false}, {"listvolumes_reconcile_cpu_s", false},
}

// scaleEnv is what the scale run works with.
type scaleEnv struct {
	cfg    *ScaleConfig
	sz     ScaleSizes
	client kubernetes.Interface // the harness's, writes counted
	writes *writeCounter
	admin  kubernetes.Interface // reads (metrics, watches)
	rest   *rest.Config
	rep    *ScaleReport
	w      *scaleWorld
	began  time.Time // the run's start, for progress lines
}

// progress prints a step's line with the time since the run began, so
// that where a run's time goes can be read off its output.
func (e *scaleEnv) progress(format string, args ...any) {
	d := time.Since(e.began).Round(time.Second)
	fmt.Fprintf(e.cfg.Out, "  [%02d:%02d] %s\n", int(d.Minutes()), int(d.Seconds())%60, fmt.Sprintf(format, args...))
}

// RunScale runs the scale scenario. Failed checks are in the report; the
// error is for a run that could not be carried out.
func RunScale(ctx context.Context, cfg ScaleConfig) (*ScaleReport, error) {
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	if cfg.Sizes == (ScaleSizes{}) {
		s, err := ScaleSizesFor(cfg.Size)
		if err != nil {
			return nil, err
		}
		cfg.Sizes = s
	}
	if cfg.Sizes.MaxEntries <= 0 {
		cfg.Sizes.MaxEntries = 500
	}
	if cfg.Sizes.TrickleWindow < time.Second {
		cfg.Sizes.TrickleWindow = 10 * time.Second
	}
	if cfg.RunID == "" {
		cfg.RunID = newRunID()
	}
	if cfg.LogDir == "" {
		dir, err := os.MkdirTemp("", "latch-scale")
		if err != nil {
			return nil, err
		}
		cfg.LogDir = dir
	}
	client, writes, admin, err := harnessClients(cfg.Cluster, "latch-scale")
	if err != nil {
		return nil, err
	}
	rep := &ScaleReport{Figures: map[string]any{}}
	for _, k := range ScaleRequiredKeys {
		rep.Figures[k.Name] = nil
		if k.KCM {
			rep.Figures["kcm_"+k.Name] = nil
		}
	}
	started := time.Now().UTC()
	rep.Figures["started"] = started.Format(time.RFC3339)
	rep.Figures["size"] = string(cfg.Size)
	rep.Figures["nodes"] = cfg.Sizes.Nodes
	rep.Figures["volumes"] = cfg.Sizes.Volumes
	rep.Figures["cpus"] = runtime.NumCPU()
	rep.Figures["go_version"] = runtime.Version()
	rep.Figures["writes_window_s"] = cfg.Sizes.WritesWindow.Seconds()
	rep.Figures["idle_window_s"] = cfg.Sizes.IdleWindow.Seconds()
	rep.Figures["trickle_window_s"] = cfg.Sizes.TrickleWindow.Seconds()
	rep.Figures["control_plane_gogc"], rep.Figures["control_plane_memory_limit_mib"] = collectorSettings()
	e := &scaleEnv{cfg: &cfg, sz: cfg.Sizes, client: client, writes: writes, admin: admin, rest: cfg.Cluster.RESTConfig(), rep: rep, began: started}
	fmt.Fprintf(cfg.Out, "latch scale: size=%s nodes=%d volumes=%d cpus=%d logs=%s\n", cfg.Size, cfg.Sizes.Nodes, cfg.Sizes.Volumes, runtime.NumCPU(), cfg.LogDir)

	err = e.run(ctx)
	if cfg.Cleanup && e.w != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
		if cerr := e.w.cleanup(cctx); cerr != nil && err == nil {
			err = fmt.Errorf("cleanup: %w", cerr)
		}
		cancel()
	}
	rep.Figures["finished"] = time.Now().UTC().Format(time.RFC3339)
	rep.Figures["wall_s"] = round2(time.Since(started).Seconds())
	if u, perr := procUsage(os.Getpid()); perr == nil {
		rep.Figures["control_plane_peak_rss_mb"] = round2(float64(u.PeakRSSBytes) / (1 << 20))
	}
	rep.Notes = append(rep.Notes,
		"not measured by this harness: the csi-attacher's CPU and RSS during the trickle and the burst (it runs inside the harness there; its cold start is measured as a child process), the per-object heap cost (make bench-objects)")
	return rep, err
}

func (e *scaleEnv) run(ctx context.Context) error {
	stopCPU := e.cpuProfile(ctx, "objects")
	w, err := e.buildWorld(ctx)
	stopCPU()
	e.w = w
	if err != nil {
		return fmt.Errorf("create the objects: %w", err)
	}
	e.heapProfile(ctx, "objects")
	defer e.heapProfile(ctx, "end")
	if err := e.attacherColdStart(ctx); err != nil {
		return fmt.Errorf("csi-attacher cold start: %w", err)
	}
	e.progress("csi-attacher: cold start and ListVolumes reconcile done")
	if err := e.attacherLimitedColdStart(ctx); err != nil {
		return fmt.Errorf("csi-attacher cold start in a container's memory limit: %w", err)
	}
	e.progress("csi-attacher: cold start in a container's memory limit done")
	if err := e.reconcileOverlap(ctx); err != nil {
		return fmt.Errorf("csi-attacher slow ListVolumes reconcile: %w", err)
	}
	e.progress("csi-attacher: slow reconciles done")
	if len(e.cfg.ControllerArgs) > 0 {
		e.rep.Notes = append(e.rep.Notes, "attachdetach-controller ran with the extra flags "+strings.Join(e.cfg.ControllerArgs, " "))
	}
	if err := e.controllerColdStart(ctx, "latch"); err != nil {
		return fmt.Errorf("attachdetach-controller cold start: %w", err)
	}
	if e.cfg.KCMBinary != "" {
		if err := e.controllerColdStart(ctx, "kcm"); err != nil {
			return fmt.Errorf("kube-controller-manager cold start: %w", err)
		}
	} else {
		e.rep.Notes = append(e.rep.Notes, "kube-controller-manager was not run (no binary)")
	}
	return nil
}

// heapProfile writes this process's heap profile as heap-<step>.pprof into
// HeapProfileDir, after a collection so that it shows the live heap. A
// failure is a note in the report, not a failed run.
func (e *scaleEnv) heapProfile(ctx context.Context, step string) {
	if e.cfg.HeapProfileDir == "" {
		return
	}
	runtime.GC()
	path := filepath.Join(e.cfg.HeapProfileDir, "heap-"+step+".pprof")
	f, err := os.Create(path)
	if err == nil {
		err = errors.Join(pprof.WriteHeapProfile(f), f.Close())
	}
	if err != nil {
		e.rep.Notes = append(e.rep.Notes, fmt.Sprintf("heap profile %s: %v", step, err))
		return
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	e.rep.Figures["control_plane_heap_"+step+"_mb"] = round2(float64(ms.HeapAlloc) / (1 << 20))
	klog.FromContext(ctx).Info("Wrote a heap profile of the control plane", "step", step, "path", path, "heapMiB", ms.HeapAlloc>>20)
}

// cpuProfile starts a CPU profile of this process as cpu-<step>.pprof in
// CPUProfileDir and returns what stops it. A failure is a note in the
// report, not a failed run.
func (e *scaleEnv) cpuProfile(ctx context.Context, step string) (stop func()) {
	if e.cfg.CPUProfileDir == "" {
		return func() {}
	}
	path := filepath.Join(e.cfg.CPUProfileDir, "cpu-"+step+".pprof")
	f, err := os.Create(path)
	if err == nil {
		if err = pprof.StartCPUProfile(f); err != nil {
			f.Close()
		}
	}
	if err != nil {
		e.rep.Notes = append(e.rep.Notes, fmt.Sprintf("cpu profile %s: %v", step, err))
		return func() {}
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			e.rep.Notes = append(e.rep.Notes, fmt.Sprintf("cpu profile %s: %v", step, err))
			return
		}
		klog.FromContext(ctx).Info("Wrote a CPU profile of the control plane", "step", step, "path", path)
	}
}

func (r *ScaleReport) check(name, target, value string, pass bool) {
	r.Checks = append(r.Checks, Check{Name: name, Target: target, Value: value, Pass: pass, Correctness: true})
}

// Failed lists the failed checks.
func (r *ScaleReport) Failed() []string {
	var out []string
	for _, c := range r.Checks {
		if !c.Pass {
			out = append(out, fmt.Sprintf("%s: %s (want %s)", c.Name, c.Value, c.Target))
		}
	}
	return out
}
