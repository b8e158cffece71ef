package bench

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/latchcsi/latch/internal/csimock"
)

// attachRig is a mock driver, nodes with CSINodes, PVs and a running
// csi-attacher that has attached one canary volume (so it is synced and
// working before anything is timed).
type attachRig struct {
	e       *env
	prefix  string
	driver  string
	d       *csimock.Driver
	stopDrv func()
	att     Component
	tracker *vaTracker
	nodes   int
}

func (e *env) names(scenario string) (prefix, driver string) {
	prefix = strings.ToLower(scenario) + "-" + e.cfg.RunID
	return prefix, prefix + ".bench.latch.dev"
}

// vaCreators is how many VolumeAttachment creates and deletes the harness
// keeps in flight in A's bursts, and in B's creates and deletes together.
func (e *env) vaCreators() int { return creatorsOr(e.cfg.Sizes.ACreators) }

// creatorsOr is a scale's creators for a burst, or the setup concurrency
// when the sizes leave it unset.
func creatorsOr(c int) int {
	if c > 0 {
		return c
	}
	return createConcurrency
}

// comps is the rig's component, by the name its figures carry.
func (r *attachRig) comps() map[string]Component { return map[string]Component{"csi-attacher": r.att} }

func (r *attachRig) pv(i int) string   { return fmt.Sprintf("%s-pv-%05d", r.prefix, i) }
func (r *attachRig) node(i int) string { return fmt.Sprintf("%s-node-%04d", r.prefix, i%r.nodes) }

// newAttachRig creates nodes and pvs PVs (plus the canary) before starting
// the attacher; the caller creates the VolumeAttachments.
func (e *env) newAttachRig(ctx context.Context, scenario string, nodes, pvs int, withNodes bool) (_ *attachRig, err error) {
	r := &attachRig{e: e, nodes: nodes}
	r.prefix, r.driver = e.names(scenario)
	defer func() {
		if err != nil {
			r.close()
		}
	}()
	if err := e.createCSINodes(ctx, nodes, r.driver, r.node, withNodes); err != nil {
		return nil, fmt.Errorf("create nodes: %w", err)
	}
	if err := e.createPVs(ctx, pvs+1, r.driver, func(i int) string {
		if i == pvs {
			return r.prefix + "-canary"
		}
		return r.pv(i)
	}); err != nil {
		return nil, fmt.Errorf("create PVs: %w", err)
	}
	return r, r.start(ctx)
}

func (r *attachRig) start(ctx context.Context) error {
	d, addr, stop, err := r.e.startDriver(ctx, r.driver)
	if err != nil {
		return fmt.Errorf("start mock driver: %w", err)
	}
	r.d, r.stopDrv = d, stop
	if r.tracker, err = r.e.trackVAs(ctx, r.driver); err != nil {
		return err
	}
	if r.att, err = r.e.cfg.Launcher.StartAttacher(ctx, addr); err != nil {
		return err
	}
	return nil
}

// canary attaches one volume and waits for it: the attacher is then
// synced and connected.
func (r *attachRig) canary(ctx context.Context) error {
	name := r.prefix + "-canary"
	if _, err := r.e.client.StorageV1().VolumeAttachments().Create(ctx, newVA(name, r.driver, name, r.node(0)), metav1.CreateOptions{}); err != nil {
		return err
	}
	return waitFor(ctx, 2*time.Minute, "the canary VolumeAttachment attached", func() bool {
		_, ok := r.tracker.attachedAt(name)
		return ok
	})
}

func (r *attachRig) close() {
	if r.att != nil {
		_ = r.att.Stop()
	}
	if r.stopDrv != nil {
		r.stopDrv()
	}
}

// createVAs creates the VolumeAttachments of PVs idx (named like their PV)
// at once and returns each one's creation time.
func (r *attachRig) createVAs(ctx context.Context, idx []int, conc int) ([]time.Time, error) {
	created := make([]time.Time, len(idx))
	err := parallel(ctx, len(idx), conc, func(ctx context.Context, k int) error {
		i := idx[k]
		_, err := r.e.client.StorageV1().VolumeAttachments().Create(ctx, newVA(r.pv(i), r.driver, r.pv(i), r.node(i)), metav1.CreateOptions{})
		created[k] = time.Now()
		return err
	})
	return created, err
}

func (r *attachRig) deleteVAs(ctx context.Context, idx []int, conc int) ([]time.Time, error) {
	deleted := make([]time.Time, len(idx))
	err := parallel(ctx, len(idx), conc, func(ctx context.Context, k int) error {
		err := r.e.client.StorageV1().VolumeAttachments().Delete(ctx, r.pv(idx[k]), metav1.DeleteOptions{})
		deleted[k] = time.Now()
		return ignoreNotFound(err)
	})
	return deleted, err
}

// attachedLatencies returns created→attached of idx and the last attach.
func (r *attachRig) attachedLatencies(idx []int, created []time.Time) ([]time.Duration, time.Time) {
	return r.latencies(idx, created, r.tracker.attachedAt)
}

// goneLatencies returns deleted→gone of idx and the last one gone.
func (r *attachRig) goneLatencies(idx []int, deleted []time.Time) ([]time.Duration, time.Time) {
	return r.latencies(idx, deleted, r.tracker.goneAt)
}

func (r *attachRig) latencies(idx []int, since []time.Time, seen func(string) (time.Time, bool)) ([]time.Duration, time.Time) {
	var lat []time.Duration
	var last time.Time
	for k, i := range idx {
		at, ok := seen(r.pv(i))
		if !ok {
			continue
		}
		lat = append(lat, at.Sub(since[k]))
		if at.After(last) {
			last = at
		}
	}
	return lat, last
}

func (r *attachRig) allAttached(idx []int) func() bool {
	return func() bool {
		for _, i := range idx {
			if _, ok := r.tracker.attachedAt(r.pv(i)); !ok {
				return false
			}
		}
		return true
	}
}

func (r *attachRig) allGone(idx []int) func() bool {
	return func() bool {
		for _, i := range idx {
			if _, ok := r.tracker.goneAt(r.pv(i)); !ok {
				return false
			}
		}
		return true
	}
}

// spanOf is the time from the earliest to the latest of ts.
func spanOf(ts []time.Time) time.Duration {
	if len(ts) == 0 {
		return 0
	}
	return slices.MaxFunc(ts, time.Time.Compare).Sub(slices.MinFunc(ts, time.Time.Compare))
}

func span(n int, from int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = from + i
	}
	return out
}

// runAttachBurst is scenario A: ABursts bursts, one after another, each
// of ABurst VolumeAttachments created at once and then all deleted at
// once, each on PVs of its own (a PV that already carries the finalizer
// would make a cheaper attach). Correctness is checked on every burst;
// the rate and p99 targets are judged on the median burst, since one
// burst on a machine whose speed drifts can land far from the others.
func runAttachBurst(ctx context.Context, e *env, res *Result) error {
	return judgedAround(ctx, e, res, func() ([]*burstRun, error) { return attachBursts(ctx, e, res) },
		func(runs []*burstRun) { judgeBursts(e, res, e.cfg.Sizes.ABurst, runs) })
}

// attachBursts runs A's bursts with a csi-attacher of their own and stops
// it, returning what each burst measured.
func attachBursts(ctx context.Context, e *env, res *Result) ([]*burstRun, error) {
	sz := e.cfg.Sizes
	n, bursts := sz.ABurst, max(1, sz.ABursts)
	r, err := e.newAttachRig(ctx, "A", sz.ANodes, n*bursts, false)
	if err != nil {
		return nil, err
	}
	defer r.close()
	if err := r.canary(ctx); err != nil {
		return nil, err
	}
	creators := e.vaCreators()
	res.Figures["va_creators"] = float64(creators)
	res.Figures["bursts"] = float64(bursts)
	runs, err := runBursts(bursts, n, func(idx []int, name func(string) string) (*burstRun, error) {
		return r.burst(ctx, e, res, idx, creators, name)
	})
	if err != nil {
		return runs, err
	}
	return runs, finalUsage(e, res, r.comps())
}

// burstRun is what one of A's bursts measured.
type burstRun struct {
	attach, detach *Phase
	attached, gone int
	duplicates     int64
	createsSeconds float64
	// percentOfPatchOnly is the attach rate as a share of the three-patch
	// limit alone; attach.PercentOfLimit is its share of the limit with
	// creates, which the target judges.
	percentOfPatchOnly float64
}

// burst creates the VolumeAttachments of PVs idx with creators calls in
// flight, waits for all to be attached, deletes them the same way and
// waits for all to be gone, adding an attach and a detach phase to res.
// It returns what it measured so far also when it fails.
func (r *attachRig) burst(ctx context.Context, e *env, res *Result, idx []int, creators int, name func(string) string) (*burstRun, error) {
	sz := e.cfg.Sizes
	n := len(idx)
	s0, err := e.snap(ctx, r.comps(), r.d)
	if err != nil {
		return nil, err
	}
	created, err := r.createVAs(ctx, idx, creators)
	if err != nil {
		return nil, fmt.Errorf("create VolumeAttachments: %w", err)
	}
	waitErr := waitFor(ctx, sz.AttachTimeout, "every VolumeAttachment attached", r.allAttached(idx))
	s1, err := e.snap(ctx, r.comps(), r.d)
	if err != nil {
		return nil, err
	}
	lat, last := r.attachedLatencies(idx, created)
	run := &burstRun{createsSeconds: spanOf(created).Seconds(), attached: len(lat), duplicates: s1.duplicates - s0.duplicates}
	run.attach = e.latencyPhase(res, name("attach"), n, int(s1.publishes-s0.publishes), lat, last, s0, s1)
	if waitErr != nil {
		return run, waitErr
	}

	deleted, err := r.deleteVAs(ctx, idx, creators)
	if err != nil {
		return run, fmt.Errorf("delete VolumeAttachments: %w", err)
	}
	waitErr = waitFor(ctx, sz.AttachTimeout, "every VolumeAttachment gone", r.allGone(idx))
	s2, err := e.snap(ctx, r.comps(), r.d)
	if err != nil {
		return run, err
	}
	lat, last = r.goneLatencies(idx, deleted)
	run.gone = len(lat)
	run.detach = e.latencyPhase(res, name("detach"), n, int(s2.unpublishes-s1.unpublishes), lat, last, s1, s2)
	return run, waitErr
}

// compare sets the burst's shares of the limit l. A's creates stand in
// for the attachdetach-controller's, and D counts the controller's creates
// among an attach's writes; so A's attach rate is judged against what the
// API server can serve of A's whole mix: one create at l's create rate
// plus the attacher's writes at l's write rate. The share of the
// three-patch limit alone is kept beside it.
func (run *burstRun) compare(l limitProbe) {
	run.attach.setLimit(l.writes)
	run.percentOfPatchOnly = run.attach.PercentOfLimit
	if c := l.ceiling(run.attach.WritesPerOp); c > 0 {
		run.attach.PercentOfLimit = 100 * run.attach.PerSecond / c
	}
	if run.detach != nil {
		run.detach.setLimit(l.writes)
	}
}

// judgeBursts adds A's checks and figures: correctness on every burst,
// the rate and p99 targets on the median burst.
func judgeBursts(e *env, res *Result, n int, runs []*burstRun) {
	if len(runs) == 0 {
		return
	}
	for _, run := range runs {
		run.compare(e.limit)
	}
	res.check("VolumeAttachments attached", fmt.Sprint(n), eachOf(runs, func(run *burstRun) string { return fmt.Sprint(run.attached) }),
		allOf(runs, func(run *burstRun) bool { return run.attached == n }), true)
	res.check("ControllerPublish calls", fmt.Sprintf("= %d", n),
		eachOf(runs, func(run *burstRun) string {
			return fmt.Sprintf("%d (duplicates %d)", run.attach.CSICalls, run.duplicates)
		}),
		allOf(runs, func(run *burstRun) bool { return run.attach.CSICalls == n && run.duplicates == 0 }), true)
	vaWrites := func(run *burstRun) float64 { return run.attach.VAWritesPerOp + run.attach.VAStatusPerOp }
	res.check("VA writes per attach", "≤ 2", eachOf(runs, func(run *burstRun) string { return fmt.Sprintf("%.2f", vaWrites(run)) }),
		allOf(runs, func(run *burstRun) bool { return vaWrites(run) <= 2 }), true)
	res.check("PV writes per PV", "≤ 1", eachOf(runs, func(run *burstRun) string { return fmt.Sprintf("%.2f", run.attach.PVWritesPerOp) }),
		allOf(runs, func(run *burstRun) bool { return run.attach.PVWritesPerOp <= 1 }), true)

	percentOfCeiling := func(run *burstRun) float64 { return run.attach.PercentOfLimit }
	mid := medianOf(runs, percentOfCeiling)
	if ceiling := e.limit.ceiling(mid.attach.WritesPerOp); ceiling > 0 {
		patchOnlyRate := e.limit.writes / mid.attach.WritesPerOp
		res.Figures["ceiling_with_creates_per_s"] = round2(ceiling)
		res.Figures["ceiling_with_creates_percent_of_limit"] = round2(100 * ceiling / patchOnlyRate)
		res.Figures["attach_rate_percent_of_ceiling"] = round2(percentOfCeiling(mid))
		res.Figures["attach_rate_percent_of_patch_only_limit"] = round2(mid.percentOfPatchOnly)
		// Even at the limit, the last of n volumes cannot attach sooner
		// than n ÷ limit after the burst starts.
		res.Figures["drain_floor_s"] = round2(float64(n) / ceiling)
		value := fmt.Sprintf("%.0f%% (%.0f/s of %.0f/s; %.0f%% of the %.0f/s limit of the three patches alone)",
			percentOfCeiling(mid), mid.attach.PerSecond, ceiling, mid.percentOfPatchOnly, patchOnlyRate)
		if len(runs) > 1 {
			value = fmt.Sprintf("%s (%.0f%% of the three-patch limit alone)",
				medianValue(runs, fmt.Sprintf("%.0f%%", percentOfCeiling(mid)), func(run *burstRun) string { return fmt.Sprintf("%.0f%%", percentOfCeiling(run)) }),
				mid.percentOfPatchOnly)
		}
		res.check("attach rate", "≥ 80% of F's limit for an attach's writes, its create included", value+limitNote(res), percentOfCeiling(mid) >= 80, false)
	}
	p99 := medianOf(runs, func(run *burstRun) float64 { return run.attach.P99Ms }).attach.P99Ms
	res.Figures["attach_p99_ms"] = round2(p99)
	res.Figures["va_creates_s"] = round2(medianOf(runs, func(run *burstRun) float64 { return run.createsSeconds }).createsSeconds)
	res.check("p99 created→attached", "≤ 2000 ms",
		medianValue(runs, fmt.Sprintf("%.0f ms", p99), func(run *burstRun) string { return fmt.Sprintf("%.0f ms", run.attach.P99Ms) }),
		p99 <= 2000, false)

	if slices.ContainsFunc(runs, func(run *burstRun) bool { return run.detach == nil }) {
		res.check("VolumeAttachments detached and gone", fmt.Sprint(n), "not every burst got to its detach", false, true)
		return
	}
	res.check("VolumeAttachments detached and gone", fmt.Sprint(n), eachOf(runs, func(run *burstRun) string { return fmt.Sprint(run.gone) }),
		allOf(runs, func(run *burstRun) bool { return run.gone == n }), true)
	res.check("ControllerUnpublish calls", fmt.Sprintf("= %d", n), eachOf(runs, func(run *burstRun) string { return fmt.Sprint(run.detach.CSICalls) }),
		allOf(runs, func(run *burstRun) bool { return run.detach.CSICalls == n }), true)
}

// finalUsage stops the components and records their totals.
func finalUsage(e *env, res *Result, comps map[string]Component) error {
	usage, err := stopAll(comps)
	if e.cfg.Launcher.Measured() {
		for name, u := range usage {
			res.Figures[name+"_cpu_s"] = round2(u.CPUSeconds)
			res.Figures[name+"_peak_rss_mb"] = round2(float64(u.PeakRSSBytes) / (1 << 20))
		}
	}
	return err
}

func round2(v float64) float64 { return math.Round(v*100) / 100 }

// runMixed is scenario B: attaches and detaches at the same time; attach
// latency must not suffer from the detaches.
func runMixed(ctx context.Context, e *env, res *Result) error {
	sz := e.cfg.Sizes
	r, err := e.newAttachRig(ctx, "B", sz.ANodes, sz.BAttach+sz.BDetach, false)
	if err != nil {
		return err
	}
	defer r.close()
	if err := r.canary(ctx); err != nil {
		return err
	}
	comps := r.comps()
	attachIdx, detachIdx := span(sz.BAttach, 0), span(sz.BDetach, sz.BAttach)
	// Setup (not timed): the volumes to detach are attached.
	if _, err := r.createVAs(ctx, detachIdx, createConcurrency); err != nil {
		return err
	}
	if err := waitFor(ctx, sz.AttachTimeout, "the volumes to detach attached", r.allAttached(detachIdx)); err != nil {
		return err
	}

	s0, err := e.snap(ctx, comps, r.d)
	if err != nil {
		return err
	}
	// B's p99 is judged against A's, so the harness pushes as hard as in
	// A: A's creators in all, half of them creating, half deleting.
	creators := e.vaCreators()
	res.Figures["va_creators"] = float64(creators)
	var created, deleted []time.Time
	var cerr, derr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		deleted, derr = r.deleteVAs(ctx, detachIdx, max(1, creators/2))
	}()
	created, cerr = r.createVAs(ctx, attachIdx, max(1, creators/2))
	<-done
	if cerr != nil || derr != nil {
		return fmt.Errorf("create/delete VolumeAttachments: %v %v", cerr, derr)
	}
	waitErr := waitFor(ctx, sz.AttachTimeout, "new volumes attached and old ones gone", func() bool {
		return r.allAttached(attachIdx)() && r.allGone(detachIdx)()
	})
	s1, err := e.snap(ctx, comps, r.d)
	if err != nil {
		return err
	}
	alat, alast := r.attachedLatencies(attachIdx, created)
	dlat, dlast := r.goneLatencies(detachIdx, deleted)
	ops := sz.BAttach + sz.BDetach
	p := &Phase{Name: "mixed", Ops: ops, CSICalls: int(s1.publishes - s0.publishes + s1.unpublishes - s0.unpublishes)}
	last := alast
	if dlast.After(last) {
		last = dlast
	}
	p.WallSeconds = last.Sub(s0.at).Seconds()
	p.PerSecond = float64(len(alat)+len(dlat)) / p.WallSeconds
	p.P50Ms, p.P99Ms = percentiles(alat)
	p.setWrites(componentWrites(s0, s1), ops)
	e.fillUsage(p, s0, s1)
	res.Phases = append(res.Phases, p)
	_, dp99 := percentiles(dlat)
	res.Figures["detach_p99_ms"] = round2(dp99)
	pubs, unpubs := int(s1.publishes-s0.publishes), int(s1.unpublishes-s0.unpublishes)
	res.check("attached and detached", fmt.Sprintf("%d + %d", sz.BAttach, sz.BDetach), fmt.Sprintf("%d + %d", len(alat), len(dlat)), len(alat) == sz.BAttach && len(dlat) == sz.BDetach, true)
	res.check("ControllerPublish / Unpublish calls", fmt.Sprintf("= %d / %d", sz.BAttach, sz.BDetach), fmt.Sprintf("%d / %d (duplicates %d)", pubs, unpubs, s1.duplicates-s0.duplicates), pubs == sz.BAttach && unpubs == sz.BDetach && s1.duplicates == s0.duplicates, true)
	if a := e.report.Result("A"); a != nil {
		// A's p99 is its median burst's.
		if ap := a.Figures["attach_p99_ms"]; ap > 0 {
			res.check("p99 attach latency", fmt.Sprintf("≤ 2 × A's (%.0f ms)", 2*ap), fmt.Sprintf("%.0f ms", p.P99Ms), p.P99Ms <= 2*ap, false)
		}
	}
	if waitErr != nil {
		return waitErr
	}
	return finalUsage(e, res, comps)
}

// runMemory is scenario C: the attacher's memory with many objects of its
// own and many more it must ignore.
func runMemory(ctx context.Context, e *env, res *Result) error {
	sz := e.cfg.Sizes
	prefix, driver := e.names("C")
	other := prefix + "-other.bench.latch.dev"
	r := &attachRig{e: e, prefix: prefix, driver: driver, nodes: sz.CNodes}
	defer r.close()
	// C's figures are for the objects it creates, not for what the
	// scenarios before it left in the cluster.
	cleared, err := e.clearStorage(ctx)
	if err != nil {
		return fmt.Errorf("remove the earlier scenarios' objects: %w", err)
	}
	res.Figures["cleared_objects"] = float64(cleared)
	setup := time.Now()
	if err := e.createCSINodes(ctx, sz.CNodes, driver, r.node, true); err != nil {
		return fmt.Errorf("create nodes: %w", err)
	}
	if err := e.createPVs(ctx, sz.CForeignPVs, other, func(i int) string { return fmt.Sprintf("%s-other-%06d", prefix, i) }); err != nil {
		return fmt.Errorf("create other driver's PVs: %w", err)
	}
	if err := e.createPVs(ctx, sz.COurs, driver, r.pv); err != nil {
		return fmt.Errorf("create PVs: %w", err)
	}
	idx := span(sz.COurs, 0)
	if _, err := r.createVAs(ctx, idx, createConcurrency); err != nil {
		return err
	}
	res.Figures["setup_s"] = round2(time.Since(setup).Seconds())

	if err := r.start(ctx); err != nil {
		return err
	}
	comps := r.comps()
	s0, err := e.snap(ctx, comps, r.d)
	if err != nil {
		return err
	}
	waitErr := waitFor(ctx, sz.AttachTimeout, "every VolumeAttachment attached", r.allAttached(idx))
	// Let the attacher settle (and a last GC report its live heap).
	time.Sleep(2 * time.Second)
	s1, err := e.snap(ctx, comps, r.d)
	if err != nil {
		return err
	}
	lat, last := r.attachedLatencies(idx, make([]time.Time, len(idx)))
	p := &Phase{Name: "sync+attach", Ops: sz.COurs, CSICalls: int(s1.publishes - s0.publishes)}
	p.WallSeconds = last.Sub(s0.at).Seconds()
	p.PerSecond = float64(len(lat)) / p.WallSeconds
	p.setWrites(componentWrites(s0, s1), sz.COurs)
	e.fillUsage(p, s0, s1)
	res.Phases = append(res.Phases, p)

	cached, err := e.countCached(ctx)
	if err != nil {
		return err
	}
	res.Figures["cached_objects"] = float64(cached)
	live := r.att.Usage()
	res.check("VolumeAttachments attached", fmt.Sprint(sz.COurs), fmt.Sprint(len(lat)), len(lat) == sz.COurs, true)
	res.check("ControllerPublish calls", fmt.Sprintf("= %d", sz.COurs), fmt.Sprint(p.CSICalls), p.CSICalls == sz.COurs, true)
	if waitErr != nil {
		return waitErr
	}
	if err := finalUsage(e, res, comps); err != nil {
		return err
	}
	if e.cfg.Launcher.Measured() {
		final := r.att.Usage()
		peak := float64(max(final.PeakRSSBytes, live.PeakRSSBytes)) / (1 << 20)
		res.Figures["live_heap_mb"] = round2(float64(live.LiveHeapBytes) / (1 << 20))
		if live.LiveHeapBytes > 0 && cached > 0 {
			res.Figures["heap_bytes_per_cached_object"] = float64(live.LiveHeapBytes / uint64(cached))
		}
		res.check("attacher peak RSS", "≤ 120 MB", fmt.Sprintf("%.0f MB", peak), peak <= 120, false)
	}
	return nil
}

// clusterKind is a cluster-scoped kind the scenarios create: how to list
// it (uncounted) and where to send writes to it (counted as the harness's).
type clusterKind struct {
	resource string
	writes   rest.Interface
	list     func(context.Context, metav1.ListOptions) (runtime.Object, error)
}

// cachedKinds are what a csi-attacher caches; clusterKinds adds Nodes.
func (e *env) cachedKinds() []clusterKind {
	storage, core := e.client.StorageV1().RESTClient(), e.client.CoreV1().RESTClient()
	return []clusterKind{
		{"volumeattachments", storage, func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return e.admin.StorageV1().VolumeAttachments().List(ctx, o)
		}},
		{"persistentvolumes", core, func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return e.admin.CoreV1().PersistentVolumes().List(ctx, o)
		}},
		{"csinodes", storage, func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return e.admin.StorageV1().CSINodes().List(ctx, o)
		}},
	}
}

func (e *env) clusterKinds() []clusterKind {
	return append(e.cachedKinds(), clusterKind{"nodes", e.client.CoreV1().RESTClient(), func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
		return e.admin.CoreV1().Nodes().List(ctx, o)
	}})
}

// clusterObject is one listed object of a clusterKind.
type clusterObject struct {
	kind clusterKind
	meta metav1.Object
}

// listAll lists every object of kinds from the API server's cache.
func listAll(ctx context.Context, kinds []clusterKind) ([]clusterObject, error) {
	var objs []clusterObject
	for _, k := range kinds {
		list, err := k.list(ctx, metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", k.resource, err)
		}
		items, err := meta.ExtractList(list)
		if err != nil {
			return nil, err
		}
		for _, item := range items {
			m, err := meta.Accessor(item)
			if err != nil {
				return nil, err
			}
			objs = append(objs, clusterObject{k, m})
		}
	}
	return objs, nil
}

// clearStorage deletes every VolumeAttachment, PersistentVolume, CSINode
// and Node in the cluster, taking off the finalizers the (by now stopped)
// attachers of earlier scenarios left on them, and returns how many objects
// it deleted.
func (e *env) clearStorage(ctx context.Context) (int, error) {
	objs, err := listAll(ctx, e.clusterKinds())
	if err != nil {
		return 0, err
	}
	noFinalizers := []byte(`{"metadata":{"finalizers":null}}`)
	err = parallel(ctx, len(objs), createConcurrency, func(ctx context.Context, i int) error {
		k, name := objs[i].kind, objs[i].meta.GetName()
		if len(objs[i].meta.GetFinalizers()) > 0 {
			err := k.writes.Patch(types.MergePatchType).Resource(k.resource).Name(name).Body(noFinalizers).Do(ctx).Error()
			if err := ignoreNotFound(err); err != nil {
				return fmt.Errorf("remove the finalizers of %s %s: %w", k.resource, name, err)
			}
		}
		if err := ignoreNotFound(k.writes.Delete().Resource(k.resource).Name(name).Do(ctx).Error()); err != nil {
			return fmt.Errorf("delete %s %s: %w", k.resource, name, err)
		}
		return nil
	})
	return len(objs), err
}

// countCached counts the objects a csi-attacher caches: every
// VolumeAttachment, PersistentVolume and CSINode.
func (e *env) countCached(ctx context.Context) (int, error) {
	objs, err := listAll(ctx, e.cachedKinds())
	return len(objs), err
}

// latencyPhase records a burst phase of n operations between the
// snapshots before and after: wall time to the last one done, rate,
// latency percentiles, writes per operation and the components' usage
// (its share of the limit is set when the scenario is judged, once the
// limit around it is known).
func (e *env) latencyPhase(res *Result, name string, n, csiCalls int, lat []time.Duration, last time.Time, before, after snapshot) *Phase {
	p := &Phase{Name: name, Ops: n, CSICalls: csiCalls}
	p.WallSeconds = last.Sub(before.at).Seconds()
	p.PerSecond = float64(len(lat)) / p.WallSeconds
	p.P50Ms, p.P99Ms = percentiles(lat)
	p.setWrites(componentWrites(before, after), n)
	e.fillUsage(p, before, after)
	res.Phases = append(res.Phases, p)
	return p
}
