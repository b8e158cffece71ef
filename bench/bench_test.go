package bench

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"math"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/latchcsi/latch/internal/localcluster"
	"github.com/latchcsi/latch/internal/testsupport"
)

var cluster *localcluster.Cluster

func TestMain(m *testing.M) {
	// A test that measures the heap runs in a child process of its own,
	// without the API server (runInChild), started before the tests.
	if os.Getenv(childTestEnv) != "" {
		os.Exit(m.Run())
	}
	flag.Parse()
	startChildren()
	code := localcluster.RunTestMain(m, &cluster)
	stopChildren()
	os.Exit(code)
}

// testSizes are the small scale's sizes cut down further for make test:
// every scenario runs the same code and the same correctness checks on
// fewer objects (A and D keep their three bursts, so that a median is
// taken). The small scale itself is make bench SCALE=small.
func testSizes(t *testing.T) Sizes {
	t.Helper()
	sz, err := SizesFor(Small)
	if err != nil {
		t.Fatal(err)
	}
	sz.AttachBurst, sz.AttachBursts = 30, 3
	sz.MixedAttaches, sz.MixedDetaches = 20, 20
	sz.MemoryOurVolumes, sz.MemoryForeignPVs, sz.MemoryNodes = 30, 300, 10
	sz.PodsCount, sz.PodsNodes, sz.PodsBursts = 12, 3, 3
	sz.IdleVolumes, sz.IdlePerPod, sz.IdleNodes = 30, 5, 2
	sz.LimitItems = 30
	return sz
}

// runSmall runs scenarios at the test sizes (testSizes) with the
// components in process and fails on any correctness check (timings are
// never checked: the machine may be busy).
func runSmall(t *testing.T, scenarios ...string) *Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out bytes.Buffer
	rep, err := Run(ctx, Config{
		Cluster:       cluster,
		Launcher:      &InProcess{RESTConfig: cluster.RESTConfig()},
		Attacher:      "in-process",
		Scale:         Small,
		Sizes:         testSizes(t),
		Scenarios:     scenarios,
		DriverLatency: 20 * time.Millisecond,
		Out:           &out,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", out.String())
	if len(rep.Results) != len(scenarios) {
		t.Fatalf("ran %d scenarios, want %d", len(rep.Results), len(scenarios))
	}
	for _, f := range rep.Failed(true) {
		t.Error(f)
	}
	return rep
}

func checkNamed(t *testing.T, r *Result, names ...string) {
	t.Helper()
	for _, n := range names {
		found := false
		for _, c := range r.Checks {
			if c.Name == n {
				found = true
			}
		}
		if !found {
			t.Errorf("scenario %s has no %q check (checks: %+v)", r.Scenario, n, r.Checks)
		}
	}
}

func TestLimitThenAttachBurstsPublishEachVolumeOnceWithAtMostThreeWritesAndDetachAll(t *testing.T) {
	rep := runSmall(t, "F", "A")
	if rep.LimitWritesPerSecond <= 0 || rep.LimitCreatesPerSecond <= 0 {
		t.Errorf("F measured no write limit or no create rate: %v writes/s, %v creates/s", rep.LimitWritesPerSecond, rep.LimitCreatesPerSecond)
	}
	a := rep.Result("A")
	bursts := rep.Sizes.AttachBursts
	if bursts < 3 || a.Figures["bursts"] != float64(bursts) {
		t.Fatalf("A ran %v bursts, want the scale's %d (at least 3, so that a median is taken)", a.Figures["bursts"], bursts)
	}
	// The ceiling A's own creates leave lies below F's limit, and A's
	// share of it is reported.
	if pct := a.Figures["ceiling_with_creates_percent_of_limit"]; pct <= 0 || pct >= 100 {
		t.Errorf("ceiling_with_creates_percent_of_limit = %v, want in (0, 100)", pct)
	}
	checkNamed(t, a, "ControllerPublish calls", "VA writes per attach", "PV writes per PV", "ControllerUnpublish calls", "attach rate", "p99 created→attached")
	// The burst's pressure on the API server is printed with it.
	if got, want := a.Figures["va_creators"], float64(rep.Sizes.AttachCreators); got != want || got <= 0 {
		t.Errorf("va_creators = %v, want the scale's %v", got, want)
	}
	n := rep.Sizes.AttachBurst
	var pcts, p99s []float64
	var maxWall float64
	for b := 1; b <= bursts; b++ {
		attach, detach := a.Phase(fmt.Sprintf("attach %d", b)), a.Phase(fmt.Sprintf("detach %d", b))
		if attach == nil || detach == nil {
			t.Fatalf("burst %d: phases = %+v", b, a.Phases)
		}
		maxWall = max(maxWall, attach.WallSeconds)
		pcts, p99s = append(pcts, round2(attach.PercentOfLimit)), append(p99s, attach.P99Ms)
		if attach.CSICalls != n || detach.CSICalls != n {
			t.Errorf("burst %d: publishes/unpublishes = %d/%d, want %d each", b, attach.CSICalls, detach.CSICalls, n)
		}
		// Attach: exactly one metadata patch, one status patch per VA and
		// one patch per PV (every burst has PVs of its own); detach: one
		// finalizer removal per VA and nothing else on VAs or PVs.
		if got := attach.Writes["PATCH volumeattachments"]; got != n {
			t.Errorf("burst %d: VA metadata patches = %d, want %d (writes %v)", b, got, n, attach.Writes)
		}
		if got := attach.Writes["PATCH volumeattachments/status"]; got != n {
			t.Errorf("burst %d: VA status patches = %d, want %d (writes %v)", b, got, n, attach.Writes)
		}
		if got := attach.Writes.Resource("persistentvolumes"); got != n {
			t.Errorf("burst %d: PV writes = %d, want %d (writes %v)", b, got, n, attach.Writes)
		}
		if got := detach.Writes.Resource("volumeattachments"); got != n {
			t.Errorf("burst %d: VA writes on detach = %d, want %d (writes %v)", b, got, n, detach.Writes)
		}
		if got := detach.Writes.Resource("volumeattachments/status") + detach.Writes.Resource("persistentvolumes"); got != 0 {
			t.Errorf("burst %d: status/PV writes on detach = %d, want 0 (writes %v)", b, got, detach.Writes)
		}
		// A's judged share counts the burst's creates (the table's
		// %limit), so it is above its share of the three-patch limit.
		if attach.PercentOfLimit <= 0 {
			t.Errorf("burst %d reports no attach rate as a share of the ceiling", b)
		}
	}
	if got, ok := a.Figures["va_creates_s"]; !ok || got < 0 || got > maxWall {
		t.Errorf("va_creates_s = %v, want within the longest attach phase's %v s", got, maxWall)
	}
	// The targets are judged on the median burst.
	slices.Sort(pcts)
	slices.Sort(p99s)
	if got, want := a.Figures["attach_rate_percent_of_ceiling"], pcts[(len(pcts)-1)/2]; got != want {
		t.Errorf("attach_rate_percent_of_ceiling = %v, want the median of the bursts' %v", got, pcts)
	}
	if got, want := a.Figures["attach_p99_ms"], round2(p99s[(len(p99s)-1)/2]); got != want {
		t.Errorf("attach_p99_ms = %v, want the median of the bursts' %v", got, p99s)
	}
	if patchOnly := a.Figures["attach_rate_percent_of_patch_only_limit"]; patchOnly <= 0 || patchOnly >= a.Figures["attach_rate_percent_of_ceiling"] {
		t.Errorf("attach_rate_percent_of_patch_only_limit = %v, want in (0, %v)", patchOnly, a.Figures["attach_rate_percent_of_ceiling"])
	}
	for _, c := range a.Checks {
		if c.Name == "p99 created→attached" && !strings.Contains(c.Value, "the median of") {
			t.Errorf("p99 check %q does not say it is a median", c.Value)
		}
		if c.Name == "attach rate" && !strings.Contains(c.Value, "the higher of") {
			t.Errorf("rate check %q does not name the limit it was judged against", c.Value)
		}
	}
	// A follows F directly, so F's probe is its limit before; one more
	// probe runs after it, and the bursts are judged against the higher.
	if a.Phase("limit before") != nil || a.Phase("limit after") == nil {
		t.Errorf("A's probes: phases %+v, want only a \"limit after\" (F's probe is the one before)", a.Phases)
	}
	before, after := a.Figures["limit_before_writes_per_s"], a.Figures["limit_after_writes_per_s"]
	if before != round2(rep.LimitWritesPerSecond) || after <= 0 {
		t.Errorf("A's limit before/after = %v/%v writes/s, want F's %v before", before, after, round2(rep.LimitWritesPerSecond))
	}
	if got, want := a.Figures["limit_writes_per_s"], round2(max(rep.LimitWritesPerSecond, after)); math.Abs(got-want) > 0.01 {
		t.Errorf("A's limit = %v writes/s, want the higher probe's %v", got, want)
	}
	if got, want := a.Figures["limit_drift_percent"], round2(100*(after-before)/before); math.Abs(got-want) > 0.02 {
		t.Errorf("limit_drift_percent = %v, want %v", got, want)
	}
	// Every burst's share is of that limit's ceiling.
	limit := limitProbe{writes: a.Figures["limit_writes_per_s"], creates: a.Figures["limit_creates_per_s"]}
	for b := 1; b <= bursts; b++ {
		attach := a.Phase(fmt.Sprintf("attach %d", b))
		if want := 100 * attach.PerSecond / limit.ceiling(attach.WritesPerOp); math.Abs(attach.PercentOfLimit-want) > 0.01 {
			t.Errorf("burst %d: %%limit = %v, want %v (of the judged limit's ceiling)", b, attach.PercentOfLimit, want)
		}
	}
	noProbeObjectsLeft(t)
}

func TestMixedAttachesAndDetachesAllCompleteWithOnePublishOrUnpublishEach(t *testing.T) {
	rep := runSmall(t, "B")
	b := rep.Result("B")
	checkNamed(t, b, "attached and detached", "ControllerPublish / Unpublish calls")
	// B pushes as hard as A, whose p99 it is compared with.
	if got, want := b.Figures["va_creators"], float64(rep.Sizes.AttachCreators); got != want || got <= 0 {
		t.Errorf("B's va_creators = %v, want A's %v", got, want)
	}
}

func TestPodsEndToEndBurstsAttachRunAndDetachEveryVolumeOnce(t *testing.T) {
	// B runs between F and D, so D probes the limit itself before and
	// after its bursts.
	rep := runSmall(t, "F", "B", "D")
	d := rep.Result("D")
	if d.Phase("limit before") == nil || d.Phase("limit after") == nil {
		t.Fatalf("D's phases %+v have no \"limit before\" and \"limit after\"", d.Phases)
	}
	limit := d.Figures["limit_writes_per_s"]
	if before, after := d.Phase("limit before").PerSecond, d.Phase("limit after").PerSecond; math.Abs(limit-round2(max(before, after))) > 0.01 {
		t.Errorf("D's limit = %v writes/s, want the higher of its probes' %v and %v", limit, before, after)
	}
	noProbeObjectsLeft(t)
	checkNamed(t, d, "Pods Running with their volume attached", "ControllerPublish calls", "VolumeAttachments gone after the Pods", "ControllerUnpublish calls", "attach rate", "p99 Pod created→attached")
	bursts := rep.Sizes.PodsBursts
	if bursts < 3 || d.Figures["bursts"] != float64(bursts) {
		t.Fatalf("D ran %v bursts, want the scale's %d (at least 3, so that a median is taken)", d.Figures["bursts"], bursts)
	}
	var phases []*Phase
	for b := 1; b <= bursts; b++ {
		p, det := d.Phase(fmt.Sprintf("attach %d", b)), d.Phase(fmt.Sprintf("detach %d", b))
		if p == nil || det == nil || p.Writes.Resource("volumeattachments") == 0 {
			t.Fatalf("burst %d: attach phase %+v, detach phase %+v", b, p, det)
		}
		if p.CSICalls != p.Ops || det.CSICalls != p.Ops {
			t.Errorf("burst %d: publishes/unpublishes = %d/%d, want %d each", b, p.CSICalls, det.CSICalls, p.Ops)
		}
		phases = append(phases, p)
	}
	// The rate is judged on the median burst, and the drain floor is that
	// burst's n over F's limit at its writes per attach.
	mid := medianOf(phases, func(p *Phase) float64 { return p.PercentOfLimit })
	if got, want := d.Figures["attach_rate_percent_of_limit"], round2(mid.PercentOfLimit); got != want {
		t.Errorf("attach_rate_percent_of_limit = %v, want the median burst's %v", got, want)
	}
	if want := 100 * mid.PerSecond / (limit / mid.WritesPerOp); math.Abs(mid.PercentOfLimit-want) > 0.01 {
		t.Errorf("median burst's %%limit = %v, want %v (of D's judged limit)", mid.PercentOfLimit, want)
	}
	want := round2(float64(mid.Ops) / (limit / mid.WritesPerOp))
	if got := d.Figures["drain_floor_s"]; math.Abs(got-want) > 0.011 || got <= 0 {
		t.Errorf("drain_floor_s = %v, want %v", got, want)
	}
	// The p99 is the median burst's, and the stage figures are that
	// burst's: the two stages split each Pod's wait, so neither stage's
	// p99 can exceed the whole wait's, and each takes some time (a watch
	// event at least).
	p := medianOf(phases, func(p *Phase) float64 { return p.P99Ms })
	if got, want := d.Figures["attach_p99_ms"], round2(p.P99Ms); got != want {
		t.Errorf("attach_p99_ms = %v, want the median of the bursts' p99s, %v", got, want)
	}
	for _, stage := range []string{"pod_to_va", "va_to_attached"} {
		p50, p99 := d.Figures[stage+"_p50_ms"], d.Figures[stage+"_p99_ms"]
		if p50 <= 0 || p99 < p50 || p99 > p.P99Ms {
			t.Errorf("%s p50/p99 = %v/%v ms, want 0 < p50 ≤ p99 ≤ the median burst's attach p99 %v ms", stage, p50, p99, p.P99Ms)
		}
	}
	if got, ok := d.Figures["pod_creates_s"]; !ok || got < 0 || got > p.WallSeconds {
		t.Errorf("pod_creates_s = %v, want within the median burst's attach phase of %v s", got, p.WallSeconds)
	}
}

func TestControllerIdleMakesNoWritesAtRestAndDetachesEverything(t *testing.T) {
	rep := runSmall(t, "E")
	e := rep.Result("E")
	checkNamed(t, e, "volumes attached, Pods Running", "API writes at rest", "VolumeAttachments gone after the Pods", "ControllerPublish / Unpublish calls")
	// The rest window opens once the burst's trailing writes ended, well
	// before the minute after which it would open regardless.
	if settle, ok := e.Figures["settle_s"]; !ok || settle >= 60 {
		t.Errorf("settle_s = %v (reported %v), want under 60 s", settle, ok)
	}
	rest := e.Phase("rest")
	if rest == nil {
		t.Fatalf("no rest phase: %+v", e.Phases)
	}
	// Nothing changes at rest, so nothing is written: no periodic status
	// rewrites, no resync storms.
	if got := rest.Writes.Total(); got != 0 {
		t.Errorf("writes at rest = %v, want none", rest.Writes)
	}
}

// C measures only the objects it creates: what earlier runs left in the
// cluster (here PVs of another driver, each held by a finalizer, as a run
// killed mid-scenario leaves them) is cleared first, finalizers and all.
func TestMemoryScenarioAttachesOurVolumesAmongManyForeignPVsAfterClearingWhatEarlierRunsLeft(t *testing.T) {
	ctx := context.Background()
	client := cluster.Client()
	const left = 50
	for i := range left {
		pv := newPV(fmt.Sprintf("left-%03d", i), "left.bench.latch.dev")
		pv.Finalizers = []string{"bench.latch.dev/left-behind"}
		if _, err := client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	rep := runSmall(t, "C")
	c := rep.Result("C")
	checkNamed(t, c, "VolumeAttachments attached", "ControllerPublish calls")
	if got, want := c.Figures["cached_objects"], float64(rep.Sizes.MemoryOurVolumes*2+rep.Sizes.MemoryForeignPVs+rep.Sizes.MemoryNodes); got != want {
		t.Errorf("cached objects = %v, want exactly C's own %v", got, want)
	}
	if got := c.Figures["cleared_objects"]; got < left {
		t.Errorf("cleared objects = %v, want at least the %d PVs left behind", got, left)
	}
	for i := range left {
		name := fmt.Sprintf("left-%03d", i)
		if _, err := client.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("PV %s left behind: get = %v, want NotFound", name, err)
		}
	}
}

func TestProcessesLauncherMeasuresAChildsCPUAndPeakRSS(t *testing.T) {
	u, err := procUsage(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if u.PeakRSSBytes == 0 {
		t.Errorf("VmHWM of this process read as 0")
	}
	m := gcLine.FindStringSubmatch("gc 7 @1.2s 3%: 0.1+2+0.02 ms clock, 0.2+1/2/0+0.04 ms cpu, 41->43->22 MB, 45 MB goal, 0 MB stacks, 0 MB globals, 2 P")
	if m == nil || m[3] != "22" {
		t.Errorf("gctrace live heap = %v, want 22", m)
	}
}

func TestAPIServerRequestTotalsAreParsedByVerbAndSubresource(t *testing.T) {
	text := strings.Join([]string{
		`# TYPE apiserver_request_total counter`,
		`apiserver_request_total{code="200",component="apiserver",dry_run="",group="storage.k8s.io",resource="volumeattachments",scope="resource",subresource="status",verb="PATCH",version="v1"} 5`,
		`apiserver_request_total{code="422",component="apiserver",dry_run="",group="storage.k8s.io",resource="volumeattachments",scope="resource",subresource="status",verb="PATCH",version="v1"} 2`,
		`apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="persistentvolumes",scope="resource",subresource="",verb="POST",version="v1"} 7`,
		`apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="cluster",subresource="",verb="LIST",version="v1"} 9`,
	}, "\n")
	w, err := parseRequestTotals([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	want := Writes{"PATCH volumeattachments/status": 7, "POST persistentvolumes": 7}
	if len(w) != len(want) || w["PATCH volumeattachments/status"] != 7 || w["POST persistentvolumes"] != 7 {
		t.Errorf("parsed %v, want %v", w, want)
	}
	for path, res := range map[string]string{
		"/apis/storage.k8s.io/v1/volumeattachments/x/status": "volumeattachments/status",
		"/api/v1/persistentvolumes/pv":                       "persistentvolumes",
		"/api/v1/namespaces/ns/pods/p/status":                "pods/status",
		"/api/v1/namespaces/ns/pods":                         "pods",
		"/apis/storage.k8s.io/v1/volumeattachments":          "volumeattachments",
	} {
		if got := testsupport.ResourceOf(path); got != res {
			t.Errorf("resourceOf(%s) = %q, want %q", path, got, res)
		}
	}
}

func TestAttachCeilingChargesEachAttachOneCreateAndItsWrites(t *testing.T) {
	l := limitProbe{writes: 900, creates: 600}
	// 1/600 + 3/900 = 1/200 s per attach.
	if got := l.ceiling(3); got < 199.99 || got > 200.01 {
		t.Errorf("ceiling = %v, want 200", got)
	}
	if got := (limitProbe{writes: 900}).ceiling(3); got != 0 {
		t.Errorf("ceiling without a create rate = %v, want 0", got)
	}
}

func TestScenarioLimitIsTheHigherOfTheProbesAroundItRateByRate(t *testing.T) {
	got := betterOf(limitProbe{writes: 1200, creates: 1600}, limitProbe{writes: 900, creates: 2000})
	if got != (limitProbe{writes: 1200, creates: 2000}) {
		t.Errorf("betterOf = %+v, want {1200 2000}", got)
	}
}

// noProbeObjectsLeft fails when a limit probe left a PersistentVolume or
// VolumeAttachment behind (their names start with "f-").
func noProbeObjectsLeft(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	client, err := kubernetes.NewForConfig(cluster.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	left := func(kind string, m metav1.ObjectMeta) {
		if strings.HasPrefix(m.Name, "f-") {
			t.Errorf("limit probe left %s %s (finalizers %v)", kind, m.Name, m.Finalizers)
		}
	}
	pvs, err := client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, pv := range pvs.Items {
		left("PersistentVolume", pv.ObjectMeta)
	}
	vas, err := client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, va := range vas.Items {
		left("VolumeAttachment", va.ObjectMeta)
	}
}

func TestFiguresPrintWholeAboveAHundredAndThreeDigitsBelow(t *testing.T) {
	for v, want := range map[float64]string{1540.33: "1540", 24: "24", 6.318: "6.32", -5.5: "-5.5", -120.4: "-120", 0.224: "0.224"} {
		if got := trimFloat(v); got != want {
			t.Errorf("trimFloat(%v) = %q, want %q", v, got, want)
		}
	}
}

func TestScenarioWhoseLimitMovedAFifthOrMoreCarriesANote(t *testing.T) {
	if note := driftNote("D", 1000, 850); note != "" {
		t.Errorf("a 15%% drift got a note: %q", note)
	}
	for _, after := range []float64{744, 1250} {
		note := driftNote("D", 1000, after)
		if !strings.Contains(note, "around D") || !strings.Contains(note, fmt.Sprintf("1000 before, %.0f after", after)) || !strings.Contains(note, "run it again") {
			t.Errorf("drift 1000 → %v: note %q, want the scenario, both limits and advice", after, note)
		}
	}
}

func TestReportReadsTheCollectorSettingsFromTheRuntime(t *testing.T) {
	prevGC := debug.SetGCPercent(250)
	prevLimit := debug.SetMemoryLimit(3 << 30)
	defer func() {
		debug.SetGCPercent(prevGC)
		debug.SetMemoryLimit(prevLimit)
	}()
	if gogc, mib := collectorSettings(); gogc != 250 || mib != 3072 {
		t.Errorf("collectorSettings() = %d, %d MiB; want 250, 3072 MiB", gogc, mib)
	}
	debug.SetMemoryLimit(math.MaxInt64)
	if _, mib := collectorSettings(); mib != 0 {
		t.Errorf("collectorSettings() memory limit with none set = %d MiB, want 0", mib)
	}
	if got := memoryLimit(0); got != "none" {
		t.Errorf("memoryLimit(0) = %q, want none", got)
	}
}

// A phase's last writes can be counted by the API server a moment after
// the harness saw the phase end: the snapshot that ends it reads the
// counters again until they agree, and keeps the time the end was seen.
func TestPhaseEndSnapshotWaitsForTheAPIServerToCountTheLastWrites(t *testing.T) {
	start := time.Now()
	counted := []int{29, 30, 30}
	var reads int
	take := func(context.Context) (snapshot, error) {
		n := counted[min(reads, len(counted)-1)]
		reads++
		return snapshot{at: start.Add(time.Duration(reads) * time.Second), api: Writes{"PATCH volumeattachments": n}}, nil
	}
	s, err := steadySnapshot(context.Background(), take, time.Millisecond, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.api["PATCH volumeattachments"]; got != 30 {
		t.Errorf("phase end counts %d finalizer removals, want all 30", got)
	}
	if want := start.Add(time.Second); !s.at.Equal(want) {
		t.Errorf("phase end at %v, want the first reading's %v", s.at, want)
	}
	if reads != 3 {
		t.Errorf("read the counters %d times, want 3 (until two readings agree)", reads)
	}
	// Counters that never settle end the wait at its limit.
	moving := 0
	s, err = steadySnapshot(context.Background(), func(context.Context) (snapshot, error) {
		moving++
		return snapshot{api: Writes{"PATCH nodes/status": moving}}, nil
	}, time.Millisecond, 20*time.Millisecond)
	if err != nil || s.api["PATCH nodes/status"] != moving || moving < 2 {
		t.Errorf("moving counters: %v after %d readings (err %v), want the last reading", s.api, moving, err)
	}
}
