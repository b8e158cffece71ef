package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"runtime/metrics"
	"slices"
	"strings"
	"time"

	"github.com/latchcsi/latch/internal/localcluster"
)

// Scale selects the sizes of every scenario.
type Scale string

const (
	// Small is a quick run for CI: the same code paths, a few hundred
	// objects, correctness figures only worth looking at.
	Small Scale = "small"
	// Full is the size the targets are defined for.
	Full Scale = "full"
)

// Sizes are the object counts of the scenarios.
type Sizes struct {
	// Attach burst (scenario A).
	AttachBurst    int `json:"ABurst"`    // VolumeAttachments created at once
	AttachNodes    int `json:"ANodes"`    // on this many nodes
	AttachBursts   int `json:"ABursts"`   // bursts run one after another; the rate and p99 targets are judged on the median
	AttachCreators int `json:"ACreators"` // VolumeAttachment creates (and deletes) in flight; docs/performance.md, "How hard the harness pushes"
	// Mixed attach and detach (B): attaches and detaches at the same time.
	MixedAttaches int `json:"BAttach"`
	MixedDetaches int `json:"BDetach"`
	// Attacher memory (C): our VAs+PVs, PVs of another driver, Nodes+CSINodes.
	MemoryOurVolumes int `json:"COurs"`
	MemoryForeignPVs int `json:"CForeignPVs"`
	MemoryNodes      int `json:"CNodes"`
	// Pods end to end (D): Pods with one volume each, on this many nodes.
	PodsCount    int `json:"DPods"`
	PodsNodes    int `json:"DNodes"`
	PodsBursts   int `json:"DBursts"`   // bursts run one after another; the p99 and rate targets are judged on the median
	PodsCreators int `json:"DCreators"` // Pod creates (and deletes) in flight; docs/performance.md, "How hard the harness pushes"
	// Controller idle (E): attached volumes, volumes per Pod, nodes, and
	// how long the controller rests.
	IdleVolumes int           `json:"EVolumes"`
	IdlePerPod  int           `json:"EPerPod"`
	IdleNodes   int           `json:"ENodes"`
	IdleRest    time.Duration `json:"ERest"`
	// API server write limit (F): objects patched (3 writes each),
	// writers in flight.
	LimitItems       int `json:"FItems"`
	LimitConcurrency int `json:"FConcurrency"`

	AttachTimeout, StepsTimeout time.Duration
}

// SizesFor returns the sizes of a scale. Each size is written
// scaled(full, small), so the two scales read side by side.
func SizesFor(s Scale) (Sizes, error) {
	if s != Full && s != Small {
		return Sizes{}, fmt.Errorf("unknown scale %q (want small or full)", s)
	}
	n := func(full, small int) int { return scaled(s, full, small) }
	d := func(full, small time.Duration) time.Duration { return scaled(s, full, small) }
	return Sizes{
		AttachBurst: n(2000, 100), AttachNodes: n(10, 2), AttachBursts: n(3, 3), AttachCreators: n(24, 8),
		MixedAttaches: n(1000, 50), MixedDetaches: n(1000, 50),
		MemoryOurVolumes: n(5000, 100), MemoryForeignPVs: n(50000, 1000), MemoryNodes: n(2000, 50),
		PodsCount: n(1000, 40), PodsNodes: n(50, 4), PodsBursts: n(3, 3), PodsCreators: n(24, 8),
		IdleVolumes: n(10000, 100), IdlePerPod: n(10, 5), IdleNodes: n(100, 4), IdleRest: d(60*time.Second, 3*time.Second),
		LimitItems: n(3000, 200), LimitConcurrency: n(64, 32),
		AttachTimeout: d(10*time.Minute, 2*time.Minute), StepsTimeout: d(15*time.Minute, 3*time.Minute),
	}, nil
}

// scaled is full at the Full scale, small at the Small one.
func scaled[T any](s Scale, full, small T) T {
	if s == Full {
		return full
	}
	return small
}

// AllScenarios are the scenario letters in the order they run: F first so
// the others can be compared with it, C last because its tens of thousands
// of objects stay in the cluster.
var AllScenarios = []string{ScenarioWriteLimit, ScenarioAttachBurst, ScenarioMixedAttachDetach, ScenarioPodsEndToEnd, ScenarioControllerIdle, ScenarioAttacherMemory}

// The scenarios' names in the report: the letters docs/performance.md and
// earlier reports use.
const (
	ScenarioAttachBurst       = "A"
	ScenarioMixedAttachDetach = "B"
	ScenarioAttacherMemory    = "C"
	ScenarioPodsEndToEnd      = "D"
	ScenarioControllerIdle    = "E"
	ScenarioWriteLimit        = "F"
)

// Config is one benchmark run.
type Config struct {
	Cluster  *localcluster.Cluster
	Launcher Launcher
	// Attacher names what runs as csi-attacher, for the report.
	Attacher string
	// ControllerFlags are the attachdetach-controller's extra flags, for
	// the report.
	ControllerFlags string
	Scale           Scale
	Sizes           Sizes    // zero: SizesFor(Scale)
	Scenarios       []string // subset of AllScenarios; empty: all
	// DriverLatency delays every ControllerPublish and
	// ControllerUnpublish of the mock driver.
	DriverLatency time.Duration
	// Out receives the table rows and PASS/FAIL lines; nil discards them.
	Out io.Writer
	// AroundScenario, when set, is called before each scenario and the
	// function it returns after it (profiles).
	AroundScenario func(scenario string) func()
	// RunID makes object and driver names unique; empty: random.
	RunID string
}

// Report is one run's figures, written as JSON.
type Report struct {
	Started            time.Time `json:"started"`
	Finished           time.Time `json:"finished"`
	Scale              Scale     `json:"scale"`
	CPUs               int       `json:"cpus"`
	GOMAXPROCS         int       `json:"gomaxprocs"`
	GoVersion          string    `json:"goVersion"`
	OS                 string    `json:"os"`
	Arch               string    `json:"arch"`
	Attacher           string    `json:"attacher"`
	ControllerFlags    string    `json:"controllerFlags,omitempty"`
	ComponentsMeasured bool      `json:"componentsMeasured"`
	DriverLatencyMS    float64   `json:"driverLatencyMs"`
	Sizes              Sizes     `json:"sizes"`
	// LimitWritesPerSecond is scenario F's figure (0 when F did not run).
	LimitWritesPerSecond float64 `json:"limitWritesPerSecond,omitempty"`
	// LimitCreatesPerSecond is F's VolumeAttachment create rate at the
	// harness's create concurrency (0 when F did not run).
	LimitCreatesPerSecond float64 `json:"limitCreatesPerSecond,omitempty"`
	// ControlPlaneGOGC and ControlPlaneMemoryLimitMiB are the collector
	// settings of this process, which runs the API server and etcd (read
	// from the Go runtime; the limit is 0 when none is set);
	// ControlPlanePeakRSSMB is its peak RSS over the run (0 when unknown).
	ControlPlaneGOGC           int       `json:"controlPlaneGOGC"`
	ControlPlaneMemoryLimitMiB int       `json:"controlPlaneMemoryLimitMiB,omitempty"`
	ControlPlanePeakRSSMB      float64   `json:"controlPlanePeakRssMb,omitempty"`
	Results                    []*Result `json:"results"`
}

// Result is one scenario's outcome.
type Result struct {
	Scenario string             `json:"scenario"`
	Title    string             `json:"title"`
	Phases   []*Phase           `json:"phases"`
	Figures  map[string]float64 `json:"figures,omitempty"`
	Checks   []Check            `json:"checks"`
	// Notes warn about how far to trust the figures (a machine that
	// drifted during the scenario).
	Notes []string `json:"notes,omitempty"`
	Error string   `json:"error,omitempty"`
}

// Phase is one measured step of a scenario (attach, detach, rest).
type Phase struct {
	Name        string  `json:"name"`
	Ops         int     `json:"ops"`
	WallSeconds float64 `json:"wallSeconds"`
	PerSecond   float64 `json:"perSecond"`
	// PercentOfLimit compares PerSecond with F's writes/s divided by this
	// phase's writes per operation. A's attach phase also counts the
	// burst's VolumeAttachment creates, at F's create rate (attachCeiling).
	PercentOfLimit float64 `json:"percentOfLimit,omitempty"`
	P50Ms          float64 `json:"p50Ms,omitempty"`
	P99Ms          float64 `json:"p99Ms,omitempty"`
	// RunningP50Ms and RunningP99Ms: Pod created → Running (scenario D).
	RunningP50Ms float64 `json:"runningP50Ms,omitempty"`
	RunningP99Ms float64 `json:"runningP99Ms,omitempty"`
	// CSICalls counts ControllerPublish (attach) or ControllerUnpublish
	// (detach) calls the driver served.
	CSICalls int `json:"csiCalls"`
	// Writes are the components' API writes (the harness's own removed).
	Writes        Writes             `json:"writes"`
	VAWritesPerOp float64            `json:"vaWritesPerOp"`
	VAStatusPerOp float64            `json:"vaStatusWritesPerOp"`
	PVWritesPerOp float64            `json:"pvWritesPerOp"`
	WritesPerOp   float64            `json:"writesPerOp"`
	CPUSeconds    map[string]float64 `json:"cpuSeconds,omitempty"`
	PeakRSSBytes  map[string]uint64  `json:"peakRssBytes,omitempty"`
}

// Check is one PASS/FAIL line.
type Check struct {
	Name   string `json:"name"`
	Target string `json:"target"`
	Value  string `json:"value"`
	Pass   bool   `json:"pass"`
	// Correctness checks must pass at any scale and on any machine;
	// the others are the performance targets.
	Correctness bool `json:"correctness"`
}

// scenario runs one scenario and fills r.
type scenario struct {
	title string
	run   func(ctx context.Context, e *env, r *Result) error
}

var scenarios = map[string]scenario{
	ScenarioAttachBurst:       {"attach burst", runAttachBurst},
	ScenarioMixedAttachDetach: {"mixed attach and detach", runMixedAttachDetach},
	ScenarioAttacherMemory:    {"attacher memory", runAttacherMemory},
	ScenarioPodsEndToEnd:      {"pods end to end", runPodsEndToEnd},
	ScenarioControllerIdle:    {"controller idle", runControllerIdle},
	ScenarioWriteLimit:        {"API server write limit", runWriteLimit},
}

// Run runs the selected scenarios in order. A failing scenario is
// recorded in its Result and the run goes on; the error is only for a run
// that could not start.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	if cfg.Sizes == (Sizes{}) {
		s, err := SizesFor(cfg.Scale)
		if err != nil {
			return nil, err
		}
		cfg.Sizes = s
	}
	order, err := selectScenarios(cfg.Scenarios)
	if err != nil {
		return nil, err
	}
	if cfg.RunID == "" {
		cfg.RunID = newRunID()
	}
	rep := &Report{
		Started: time.Now().UTC(), Scale: cfg.Scale,
		CPUs: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), GoVersion: runtime.Version(),
		OS: runtime.GOOS, Arch: runtime.GOARCH, Attacher: cfg.Attacher, ControllerFlags: cfg.ControllerFlags,
		ComponentsMeasured: cfg.Launcher.Measured(),
		DriverLatencyMS:    float64(cfg.DriverLatency) / float64(time.Millisecond), Sizes: cfg.Sizes,
	}
	rep.ControlPlaneGOGC, rep.ControlPlaneMemoryLimitMiB = collectorSettings()
	client, writes, admin, err := harnessClients(cfg.Cluster, "latch-bench")
	if err != nil {
		return nil, err
	}
	e := &env{cfg: &cfg, client: client, writes: writes, admin: admin, report: rep}
	controller := "latch attachdetach-controller"
	if cfg.ControllerFlags != "" {
		controller += " " + cfg.ControllerFlags
	}
	fmt.Fprintf(cfg.Out, "latch bench: scale=%s cpus=%d go=%s attacher=%s controller=%s driver latency=%s control plane GOGC=%d memory limit=%s\n\n",
		cfg.Scale, rep.CPUs, rep.GoVersion, cfg.Attacher, controller, cfg.DriverLatency, rep.ControlPlaneGOGC, memoryLimit(rep.ControlPlaneMemoryLimitMiB))
	printHeader(cfg.Out)
	for _, name := range order {
		sc := scenarios[name]
		r := &Result{Scenario: name, Title: sc.title, Figures: map[string]float64{}}
		var done func()
		if cfg.AroundScenario != nil {
			done = cfg.AroundScenario(name)
		}
		e.previous, e.probed = e.probed, nil
		if err := sc.run(ctx, e, r); err != nil {
			r.Error = err.Error()
		}
		if done != nil {
			done()
		}
		rep.Results = append(rep.Results, r)
		printResult(cfg.Out, r)
		if ctx.Err() != nil {
			break
		}
	}
	rep.Finished = time.Now().UTC()
	if u, err := procUsage(os.Getpid()); err == nil {
		rep.ControlPlanePeakRSSMB = round2(float64(u.PeakRSSBytes) / (1 << 20))
		fmt.Fprintf(cfg.Out, "\nAPI server and etcd (this process, GOGC=%d): peak RSS %.0f MB\n", rep.ControlPlaneGOGC, rep.ControlPlanePeakRSSMB)
	}
	return rep, nil
}

// collectorSettings reads this process's GOGC and soft memory limit (in
// MiB, 0 when none is set) from the Go runtime, whoever set them.
func collectorSettings() (gogc, limitMiB int) {
	samples := []metrics.Sample{{Name: "/gc/gogc:percent"}, {Name: "/gc/gomemlimit:bytes"}}
	metrics.Read(samples)
	gogc = int(samples[0].Value.Uint64())
	if limit := samples[1].Value.Uint64(); limit < math.MaxInt64 {
		limitMiB = int(limit >> 20)
	}
	return gogc, limitMiB
}

// memoryLimit prints a soft memory limit of the report's header.
func memoryLimit(mib int) string {
	if mib == 0 {
		return "none"
	}
	return fmt.Sprint(mib, " MiB")
}

func selectScenarios(names []string) ([]string, error) {
	if len(names) == 0 {
		return AllScenarios, nil
	}
	var out []string
	for _, n := range names {
		n = strings.ToUpper(strings.TrimSpace(n))
		if _, ok := scenarios[n]; !ok {
			return nil, fmt.Errorf("unknown scenario %q (want some of %s)", n, strings.Join(AllScenarios, ","))
		}
	}
	for _, n := range AllScenarios {
		if slices.ContainsFunc(names, func(s string) bool { return strings.EqualFold(strings.TrimSpace(s), n) }) {
			out = append(out, n)
		}
	}
	return out, nil
}

// Result returns the result of scenario name, or nil.
func (r *Report) Result(name string) *Result {
	for _, res := range r.Results {
		if res.Scenario == name {
			return res
		}
	}
	return nil
}

// Phase returns the named phase, or nil.
func (r *Result) Phase(name string) *Phase {
	for _, p := range r.Phases {
		if p.Name == name {
			return p
		}
	}
	return nil
}

// Failed lists the checks that failed; correctnessOnly keeps only those.
func (r *Report) Failed(correctnessOnly bool) []string {
	var out []string
	for _, res := range r.Results {
		if res.Error != "" {
			out = append(out, res.Scenario+": "+res.Error)
		}
		for _, c := range res.Checks {
			if !c.Pass && (c.Correctness || !correctnessOnly) {
				out = append(out, fmt.Sprintf("%s: %s: %s (target %s)", res.Scenario, c.Name, c.Value, c.Target))
			}
		}
	}
	return out
}

func (r *Result) check(name, target, value string, pass, correctness bool) {
	r.Checks = append(r.Checks, Check{Name: name, Target: target, Value: value, Pass: pass, Correctness: correctness})
}
