package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/latchcsi/latch/internal/localcluster"
)

// bench-peers (docs/performance.md, "Against upstream: make bench-peers")
// runs latch's components beside their upstream counterparts and latch's
// previous release on one control plane, in interleaved rounds: each round
// runs every contender once, in an order that rotates from round to
// round, so that a machine whose speed drifts during the run weighs on
// every contender alike. The report gives every round's figures, the
// median of each figure over the rounds and its ratio to latch's.

// PeerAttacher is a csi-attacher contender: any
// external-attacher-compatible binary with its flags.
type PeerAttacher struct {
	// Name is the contender's name in the report ("latch fixed",
	// "upstream tuned").
	Name string `json:"name"`
	// Binary is run with --csi-address and --kubeconfig, then Args.
	Binary string   `json:"binary"`
	Args   []string `json:"args,omitempty"`
	// Latch marks latch's own builds: for them one ControllerPublish per
	// VolumeAttachment is a correctness check (for upstream it is a
	// figure).
	Latch bool `json:"latch"`
	// Previous marks an earlier release of latch: its failed checks are
	// findings, like upstream's, not failures of the run.
	Previous bool `json:"previous,omitempty"`
	// Latency runs the paced and saturating workloads (latency, writes,
	// CPU, RSS); Backends the backend profiles (throughput against the
	// backend's capacity, throttled calls).
	Latency  bool `json:"latency"`
	Backends bool `json:"backends"`
}

// PeerController is an attach/detach controller contender: latch's
// attachdetach-controller (a build of any revision) or
// kube-controller-manager running only its attachdetach controller.
type PeerController struct {
	Name   string   `json:"name"`
	Binary string   `json:"binary"`
	Args   []string `json:"args,omitempty"`
	// KCM starts Binary as kube-controller-manager
	// (stack.KubeControllerManagerArgs, --controllers=attachdetach), with
	// Args after its own.
	KCM      bool `json:"kcm"`
	Latch    bool `json:"latch"`
	Previous bool `json:"previous,omitempty"`
}

// The reference contenders: ratios are every other contender's median
// divided by theirs.
const (
	// PeerLatchAdaptive is this checkout's csi-attacher with its default
	// flags (adaptive driver concurrency); PeerLatchFixed the same binary
	// with --driver-concurrency=fixed.
	PeerLatchAdaptive   = "latch adaptive"
	PeerLatchFixed      = "latch fixed"
	PeerLatchController = "latch"
)

// LatchFixedArgs are the flags of the "latch fixed" contender.
var LatchFixedArgs = []string{"--driver-concurrency=fixed"}

// PeerSizes are the object counts and rates of bench-peers' workloads.
type PeerSizes struct {
	// Nodes the attacher workloads spread their VolumeAttachments over.
	Nodes int `json:"nodes"`
	// Paced: this many VolumeAttachments created at PacedRate per second
	// (below saturation), then deleted at the same rate.
	Paced     int     `json:"paced"`
	PacedRate float64 `json:"pacedRate"`
	// Saturated: this many created at once with Creators calls in flight
	// (A's burst), then deleted the same way.
	Saturated int `json:"saturated"`
	Creators  int `json:"creators"`
	// Backend: VolumeAttachments of one burst per profile (attach all,
	// then detach all).
	Backend map[string]int `json:"backend"`
	// Pods: one volume each, on PodNodes simulated nodes, created at once
	// with Creators calls in flight, then deleted.
	Pods     int `json:"pods"`
	PodNodes int `json:"podNodes"`
	// DriverLatency of ControllerPublish and ControllerUnpublish in the
	// paced, saturated and controller workloads (the backend profiles set
	// their own).
	DriverLatency time.Duration `json:"driverLatency"`
	// Timeout of each wait for every volume attached or gone.
	Timeout time.Duration `json:"timeout"`
	// BackendBudget bounds one backend profile's burst, its attaches and
	// detaches together. A contender that has not served the burst by
	// then is measured over the budget (its share of capacity is the
	// operations it completed in that time), its leftover
	// VolumeAttachments are removed, and the next profile begins.
	BackendBudget time.Duration `json:"backendBudget"`
	// BackendSeed seeds the backend profiles' latency samples (0: the
	// mock driver's seed, the same in every run). Each round draws the
	// same sequence; another seed is another draw of the same profiles.
	BackendSeed uint64 `json:"backendSeed,omitempty"`
}

// PeerBackendProfiles are the mock driver's backend profiles the backend
// workload runs, in order.
var PeerBackendProfiles = []string{"slow-cloud", "fast-san", "throttling-api"}

// PeerSizesFor returns the sizes of a scale (small or full).
func PeerSizesFor(s Scale) (PeerSizes, error) {
	if s != Full && s != Small {
		return PeerSizes{}, fmt.Errorf("unknown scale %q (want small or full)", s)
	}
	n := func(full, small int) int { return scaled(s, full, small) }
	return PeerSizes{
		Nodes: n(10, 2), Paced: n(500, 40), PacedRate: scaled(s, 50.0, 20.0),
		Saturated: n(1000, 100), Creators: n(24, 8),
		// slow-cloud serves 7.7 operations a second: 240 attaches and
		// 240 detaches are a minute at its capacity, long enough that
		// the start of a burst (the limit finding the backend's pace)
		// and its tail (the last calls' spread) weigh little. throttling-api drops to 25
		// a second 20 s after the burst starts and is back 20 s later:
		// 1,500 attaches and detaches span both changes at full size.
		Backend: map[string]int{
			"slow-cloud":     n(240, 16),
			"fast-san":       n(600, 100),
			"throttling-api": n(1500, 100),
		},
		Pods: n(500, 20), PodNodes: n(50, 4),
		DriverLatency: 20 * time.Millisecond,
		Timeout:       scaled(s, 10*time.Minute, 2*time.Minute),
		// latch serves slow-cloud's full burst in 70 s; upstream at 100
		// workers, whose throttled calls each back off up to 5 minutes,
		// had not served it after 15.
		BackendBudget: scaled(s, 5*time.Minute, 2*time.Minute),
	}, nil
}

// PeersConfig is one bench-peers run.
type PeersConfig struct {
	Cluster *localcluster.Cluster
	Scale   Scale
	Sizes   PeerSizes // zero: PeerSizesFor(Scale)
	Rounds  int       // at least 1
	// Attachers and Controllers are the contenders, in their order of the
	// first round.
	Attachers   []PeerAttacher
	Controllers []PeerController
	// Profiles are the backend profiles to run (default
	// PeerBackendProfiles).
	Profiles []string
	// Kubeconfig of the control plane, for the child processes; LogDir
	// receives their logs.
	Kubeconfig string
	LogDir     string
	// Skipped names contenders left out and why (printed and kept in the
	// report).
	Skipped []string
	Out     io.Writer
	RunID   string
}

// PeersReport is a bench-peers run: every run's figures, then the
// medians and ratios.
type PeersReport struct {
	Started     time.Time        `json:"started"`
	Finished    time.Time        `json:"finished"`
	Scale       Scale            `json:"scale"`
	CPUs        int              `json:"cpus"`
	GOMAXPROCS  int              `json:"gomaxprocs"`
	GoVersion   string           `json:"goVersion"`
	Rounds      int              `json:"rounds"`
	Sizes       PeerSizes        `json:"sizes"`
	Profiles    []string         `json:"profiles"`
	Attachers   []PeerAttacher   `json:"attachers"`
	Controllers []PeerController `json:"controllers"`
	Skipped     []string         `json:"skipped,omitempty"`
	// Runs are every contender's run of every round, in the order they
	// ran.
	Runs []*PeerRun `json:"runs"`
	// Medians are each contender's figures' medians over the rounds,
	// Ratios each median divided by the reference contender's (latch
	// fixed for attachers, latch for controllers).
	Medians map[string]map[string]float64 `json:"medians"`
	Ratios  map[string]map[string]float64 `json:"ratios"`
	// runID is in every object name of the run.
	runID string
}

// PeerRun is one contender's run in one round.
type PeerRun struct {
	Round     int                `json:"round"`
	Kind      string             `json:"kind"` // "attacher" or "controller"
	Contender string             `json:"contender"`
	Started   time.Time          `json:"started"`
	Seconds   float64            `json:"seconds"`
	Figures   map[string]float64 `json:"figures"`
	Checks    []Check            `json:"checks"`
	// Writes are the contender's own API writes over the run by "VERB
	// resource[/subresource]", where the run counts them (controllers).
	Writes Writes `json:"writes,omitempty"`
	Error  string `json:"error,omitempty"`
	latch  bool
}

func (r *PeerRun) check(name, target, value string, pass bool) {
	r.Checks = append(r.Checks, Check{Name: name, Target: target, Value: value, Pass: pass, Correctness: true})
}

// Failed lists the failed correctness checks and errors of this
// checkout's latch contenders; upstream's and the previous release's are
// findings, printed but not failures of the run. all lists every
// contender's.
func (r *PeersReport) Failed(all bool) []string {
	var out []string
	for _, run := range r.Runs {
		if !run.latch && !all {
			continue
		}
		who := fmt.Sprintf("round %d %s %s", run.Round, run.Kind, run.Contender)
		if run.Error != "" {
			out = append(out, who+": "+run.Error)
		}
		for _, c := range run.Checks {
			if !c.Pass {
				out = append(out, fmt.Sprintf("%s: %s: %s (target %s)", who, c.Name, c.Value, c.Target))
			}
		}
	}
	return out
}

// rotated is the order of round (counted from 0): the list rotated left
// by round, so every contender runs first in one round out of len(list).
func rotated[T any](list []T, round int) []T {
	if len(list) == 0 {
		return nil
	}
	k := round % len(list)
	return append(append([]T{}, list[k:]...), list[:k]...)
}

// RunPeers runs cfg.Rounds rounds: in each, every attacher contender in
// the round's order, then every controller contender in the round's
// order. A contender's failed run is recorded in its PeerRun and the
// rounds go on; the error is only for a run that could not start.
func RunPeers(ctx context.Context, cfg PeersConfig) (*PeersReport, error) {
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	if cfg.Sizes.Nodes == 0 {
		s, err := PeerSizesFor(cfg.Scale)
		if err != nil {
			return nil, err
		}
		cfg.Sizes = s
	}
	if cfg.Rounds < 1 {
		return nil, fmt.Errorf("rounds must be at least 1, got %d", cfg.Rounds)
	}
	if cfg.Profiles == nil {
		cfg.Profiles = PeerBackendProfiles
	}
	if cfg.RunID == "" {
		cfg.RunID = newRunID()
	}
	if cfg.LogDir == "" {
		cfg.LogDir = os.TempDir()
	}
	rep := &PeersReport{
		Started: time.Now().UTC(), Scale: cfg.Scale, CPUs: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0),
		GoVersion: runtime.Version(), Rounds: cfg.Rounds, Sizes: cfg.Sizes, Profiles: cfg.Profiles,
		Attachers: cfg.Attachers, Controllers: cfg.Controllers, Skipped: cfg.Skipped, runID: cfg.RunID,
	}
	client, writes, admin, err := harnessClients(cfg.Cluster, "latch-bench-peers")
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(cfg.Out, "bench-peers: scale=%s rounds=%d cpus=%d go=%s\n", cfg.Scale, cfg.Rounds, rep.CPUs, rep.GoVersion)
	for _, s := range cfg.Skipped {
		fmt.Fprintf(cfg.Out, "SKIPPED %s\n", s)
	}
	for round := 1; round <= cfg.Rounds; round++ {
		for _, a := range rotated(cfg.Attachers, round-1) {
			run := &PeerRun{Round: round, Kind: "attacher", Contender: a.Name, latch: a.Latch && !a.Previous, Figures: map[string]float64{}, Started: time.Now().UTC()}
			e := peerEnv(&cfg, client, writes, admin)
			if err := runPeerAttacher(ctx, e, &cfg, a, run, fmt.Sprintf("pa%d-%s", round, slug(a.Name))); err != nil {
				run.Error = err.Error()
			}
			finishRun(cfg.Out, rep, run)
			if ctx.Err() != nil {
				rep.summarize()
				return rep, ctx.Err()
			}
		}
		for _, c := range rotated(cfg.Controllers, round-1) {
			run := &PeerRun{Round: round, Kind: "controller", Contender: c.Name, latch: c.Latch && !c.Previous, Figures: map[string]float64{}, Started: time.Now().UTC()}
			e := peerEnv(&cfg, client, writes, admin)
			if err := runPeerController(ctx, e, &cfg, c, run, fmt.Sprintf("pc%d-%s", round, slug(c.Name))); err != nil {
				run.Error = err.Error()
			}
			finishRun(cfg.Out, rep, run)
			if ctx.Err() != nil {
				rep.summarize()
				return rep, ctx.Err()
			}
		}
	}
	rep.Finished = time.Now().UTC()
	rep.summarize()
	return rep, nil
}

// peerEnv is the env the bench's rigs work with, for one contender's run
// (its launcher is set by the run).
func peerEnv(cfg *PeersConfig, client kubernetes.Interface, writes *writeCounter, admin kubernetes.Interface) *env {
	return &env{
		cfg:    &Config{Cluster: cfg.Cluster, RunID: cfg.RunID, DriverLatency: cfg.Sizes.DriverLatency, Scale: cfg.Scale},
		client: client, writes: writes, admin: admin,
	}
}

func finishRun(out io.Writer, rep *PeersReport, run *PeerRun) {
	run.Seconds = round2(time.Since(run.Started).Seconds())
	rep.Runs = append(rep.Runs, run)
	printPeerRun(out, run)
}

var notSlug = regexp.MustCompile(`[^a-z0-9]+`)

// slug makes a contender's name usable in object names.
func slug(name string) string {
	return strings.Trim(notSlug.ReplaceAllString(strings.ToLower(name), "-"), "-")
}

// DefaultPeersOut is the JSON report's path for a run started at started.
func DefaultPeersOut(dir string, scale Scale, started time.Time) string {
	return filepath.Join(dir, fmt.Sprintf("bench-peers-%s-%s.json", scale, started.UTC().Format("20060102T150405Z")))
}
