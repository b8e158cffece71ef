package bench

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"
)

// runAttachBurst is scenario A: AttachBursts bursts, one after another, each
// of AttachBurst VolumeAttachments created at once and then all deleted at
// once, each on PVs of its own (a PV that already carries the finalizer
// would make a cheaper attach). Correctness is checked on every burst;
// the rate and p99 targets are judged on the median burst, since one
// burst on a machine whose speed drifts can land far from the others.
func runAttachBurst(ctx context.Context, e *env, res *Result) error {
	return judgedAround(ctx, e, res, func() ([]*burstRun, error) { return attachBursts(ctx, e, res) },
		func(runs []*burstRun) { judgeBursts(e, res, e.cfg.Sizes.AttachBurst, runs) })
}

// attachBursts runs A's bursts with a csi-attacher of their own and stops
// it, returning what each burst measured.
func attachBursts(ctx context.Context, e *env, res *Result) ([]*burstRun, error) {
	sz := e.cfg.Sizes
	n, bursts := sz.AttachBurst, max(1, sz.AttachBursts)
	r, err := e.newAttachRig(ctx, ScenarioAttachBurst, sz.AttachNodes, n*bursts, false)
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
	s1, err := e.snapEnd(ctx, r.comps(), r.d)
	if err != nil {
		return nil, err
	}
	lat, last := r.attachedLatencies(idx, created)
	run := &burstRun{createsSeconds: spanOf(created).Seconds(), attached: len(lat), duplicates: s1.duplicates - s0.duplicates}
	run.attach = e.latencyPhase(res, name("attach"), n, int(s1.publishes-s0.publishes), lat, last, s0, s1)
	if waitErr != nil {
		return run, waitErr
	}

	s1.at = time.Now() // the detach phase starts here, after s1's readings
	deleted, err := r.deleteVAs(ctx, idx, creators)
	if err != nil {
		return run, fmt.Errorf("delete VolumeAttachments: %w", err)
	}
	waitErr = waitFor(ctx, sz.AttachTimeout, "every VolumeAttachment gone", r.allGone(idx))
	s2, err := e.snapEnd(ctx, r.comps(), r.d)
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

// runMixedAttachDetach is scenario B: attaches and detaches at the same time; attach
// latency must not suffer from the detaches.
func runMixedAttachDetach(ctx context.Context, e *env, res *Result) error {
	sz := e.cfg.Sizes
	r, err := e.newAttachRig(ctx, ScenarioMixedAttachDetach, sz.AttachNodes, sz.MixedAttaches+sz.MixedDetaches, false)
	if err != nil {
		return err
	}
	defer r.close()
	if err := r.canary(ctx); err != nil {
		return err
	}
	comps := r.comps()
	attachIdx, detachIdx := span(sz.MixedAttaches, 0), span(sz.MixedDetaches, sz.MixedAttaches)
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
	s1, err := e.snapEnd(ctx, comps, r.d)
	if err != nil {
		return err
	}
	alat, alast := r.attachedLatencies(attachIdx, created)
	dlat, dlast := r.goneLatencies(detachIdx, deleted)
	ops := sz.MixedAttaches + sz.MixedDetaches
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
	res.check("attached and detached", fmt.Sprintf("%d + %d", sz.MixedAttaches, sz.MixedDetaches), fmt.Sprintf("%d + %d", len(alat), len(dlat)), len(alat) == sz.MixedAttaches && len(dlat) == sz.MixedDetaches, true)
	res.check("ControllerPublish / Unpublish calls", fmt.Sprintf("= %d / %d", sz.MixedAttaches, sz.MixedDetaches), fmt.Sprintf("%d / %d (duplicates %d)", pubs, unpubs, s1.duplicates-s0.duplicates), pubs == sz.MixedAttaches && unpubs == sz.MixedDetaches && s1.duplicates == s0.duplicates, true)
	if a := e.report.Result(ScenarioAttachBurst); a != nil {
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
