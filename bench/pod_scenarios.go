package bench

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"
)

// runPodsEndToEnd is scenario D: Pods with one volume each, through both
// controllers and the kubelet stand-in, then deleted; PodsBursts times, each
// on volumes of its own, judged like A on the median burst.
func runPodsEndToEnd(ctx context.Context, e *env, res *Result) error {
	return judgedAround(ctx, e, res, func() ([]*podBurst, error) { return podBursts(ctx, e, res) },
		func(runs []*podBurst) { judgePodBursts(e, res, e.cfg.Sizes.PodsCount, runs) })
}

// podBursts runs D's bursts with components of their own and stops them,
// returning what each burst measured.
func podBursts(ctx context.Context, e *env, res *Result) ([]*podBurst, error) {
	sz := e.cfg.Sizes
	n, bursts := sz.PodsCount, max(1, sz.PodsBursts)
	r, err := e.newPodRig(ctx, ScenarioPodsEndToEnd, n*bursts, 1, sz.PodsNodes)
	if err != nil {
		return nil, err
	}
	defer r.close()
	r.creators = creatorsOr(sz.PodsCreators)
	res.Figures["pod_creators"] = float64(r.creators)
	res.Figures["bursts"] = float64(bursts)
	runs, err := runBursts(bursts, n, func(idx []int, name func(string) string) (*podBurst, error) {
		return r.burst(ctx, e, res, idx, name)
	})
	if err != nil {
		return runs, err
	}
	comps := r.comps
	r.comps = nil
	return runs, finalUsage(e, res, comps)
}

// podBurst is what one of D's bursts measured.
type podBurst struct {
	attach, detach    *Phase
	attached, running int
	duplicates        int64
	kubeletWrites     float64
	stages            map[string]float64
	vasLeft           int
}

// burst creates Pods idx at once, waits for all to be Running, deletes
// them the same way and waits for their VolumeAttachments to be gone,
// adding an attach and a detach phase to res. It returns what it measured
// so far also when it fails.
func (r *podRig) burst(ctx context.Context, e *env, res *Result, idx []int, name func(string) string) (*podBurst, error) {
	sz := e.cfg.Sizes
	n := len(idx)
	s0, err := e.snap(ctx, r.comps, r.d)
	if err != nil {
		return nil, err
	}
	k0 := r.kubeWrites.snapshot()
	created, err := r.createPods(ctx, idx)
	if err != nil {
		return nil, fmt.Errorf("create Pods: %w", err)
	}
	waitErr := waitFor(ctx, sz.AttachTimeout, "every Pod Running", r.allRunning(idx))
	s1, err := e.snapEnd(ctx, r.comps, r.d)
	if err != nil {
		return nil, err
	}
	k1 := r.kubeWrites.snapshot()
	attached, running, last := r.attachFigures(idx, created)
	p := &Phase{Name: name("attach"), Ops: n, CSICalls: int(s1.publishes - s0.publishes)}
	p.WallSeconds = last.Sub(s0.at).Seconds()
	p.PerSecond = float64(len(attached)) / p.WallSeconds
	p.P50Ms, p.P99Ms = percentiles(attached)
	p.RunningP50Ms, p.RunningP99Ms = percentiles(running)
	p.setWrites(componentWrites(s0, s1), n)
	e.fillUsage(p, s0, s1)
	res.Phases = append(res.Phases, p)
	run := &podBurst{
		attach: p, attached: len(attached), running: len(running), duplicates: s1.duplicates - s0.duplicates,
		kubeletWrites: float64(k1.Sub(k0).Total()) / float64(n), stages: r.stageFigures(idx, created),
	}
	if waitErr != nil {
		return run, waitErr
	}
	s1.at = time.Now() // the detach phase starts here, after s1's readings
	run.detach, run.vasLeft, waitErr, err = r.detachAll(ctx, e, res, name("detach"), idx, n, s1, sz.AttachTimeout)
	if err != nil {
		return run, err
	}
	return run, waitErr
}

// compare sets the burst's shares of the limit l, known only once it was
// probed after the bursts.
func (run *podBurst) compare(l limitProbe) {
	run.attach.setLimit(l.writes)
	if run.detach != nil {
		run.detach.setLimit(l.writes)
	}
}

// judgePodBursts adds D's checks and figures: correctness on every burst,
// the p99 and rate targets on the median burst.
func judgePodBursts(e *env, res *Result, n int, runs []*podBurst) {
	if len(runs) == 0 {
		return
	}
	res.check("Pods Running with their volume attached", fmt.Sprint(n),
		eachOf(runs, func(run *podBurst) string { return fmt.Sprintf("%d attached, %d Running", run.attached, run.running) }),
		allOf(runs, func(run *podBurst) bool { return run.attached == n && run.running == n }), true)
	for _, run := range runs {
		run.compare(e.limit)
	}
	res.check("ControllerPublish calls", fmt.Sprintf("= %d", n),
		eachOf(runs, func(run *podBurst) string {
			return fmt.Sprintf("%d (duplicates %d)", run.attach.CSICalls, run.duplicates)
		}),
		allOf(runs, func(run *podBurst) bool { return run.attach.CSICalls == n && run.duplicates == 0 }), true)

	// The stage split and the harness's create time are the median-p99
	// burst's, so they explain the p99 that is judged.
	slow := medianOf(runs, func(run *podBurst) float64 { return run.attach.P99Ms })
	maps.Copy(res.Figures, slow.stages)
	res.Figures["attach_p99_ms"] = round2(slow.attach.P99Ms)
	res.check("p99 Pod created→attached", "≤ 2000 ms",
		medianValue(runs, fmt.Sprintf("%.0f ms", slow.attach.P99Ms), func(run *podBurst) string { return fmt.Sprintf("%.0f ms", run.attach.P99Ms) }),
		slow.attach.P99Ms <= 2000, false)
	mid := medianOf(runs, func(run *podBurst) float64 { return run.attach.PercentOfLimit })
	res.Figures["kubelet_writes_per_attach"] = round2(mid.kubeletWrites)
	if mid.attach.PercentOfLimit > 0 {
		// Even at the limit the last Pod's volume cannot attach sooner
		// than this after the burst starts: how long a p99 the day's
		// machine allows at all.
		res.Figures["drain_floor_s"] = round2(float64(n) / (e.limit.writes / mid.attach.WritesPerOp))
		res.Figures["attach_rate_percent_of_limit"] = round2(mid.attach.PercentOfLimit)
		res.check("attach rate", "≥ 60% of F's limit for the combined writes",
			medianValue(runs, fmt.Sprintf("%.0f%% (%.0f/s at %.2f writes per attach)", mid.attach.PercentOfLimit, mid.attach.PerSecond, mid.attach.WritesPerOp),
				func(run *podBurst) string { return fmt.Sprintf("%.0f%%", run.attach.PercentOfLimit) })+limitNote(res),
			mid.attach.PercentOfLimit >= 60, false)
	}

	if slices.ContainsFunc(runs, func(run *podBurst) bool { return run.detach == nil }) {
		res.check("VolumeAttachments gone after the Pods", "0 left", "not every burst got to its detach", false, true)
		return
	}
	res.check("VolumeAttachments gone after the Pods", "0 left", eachOf(runs, func(run *podBurst) string { return fmt.Sprintf("%d left", run.vasLeft) }),
		allOf(runs, func(run *podBurst) bool { return run.vasLeft == 0 }), true)
	res.check("ControllerUnpublish calls", fmt.Sprintf("= %d", n), eachOf(runs, func(run *podBurst) string { return fmt.Sprint(run.detach.CSICalls) }),
		allOf(runs, func(run *podBurst) bool { return run.detach.CSICalls == n }), true)
}

// runControllerIdle is scenario E: many attached volumes at rest; the controller's
// CPU must not grow with them.
func runControllerIdle(ctx context.Context, e *env, res *Result) error {
	sz := e.cfg.Sizes
	pods := sz.IdleVolumes / sz.IdlePerPod
	n := pods * sz.IdlePerPod
	r, err := e.newPodRig(ctx, ScenarioControllerIdle, pods, sz.IdlePerPod, sz.IdleNodes)
	if err != nil {
		return err
	}
	defer r.close()
	s0, err := e.snap(ctx, r.comps, r.d)
	if err != nil {
		return err
	}
	idx := span(pods, 0)
	created, err := r.createPods(ctx, idx)
	if err != nil {
		return fmt.Errorf("create Pods: %w", err)
	}
	waitErr := waitFor(ctx, sz.StepsTimeout, "every Pod Running", r.allRunning(idx))
	s1, err := e.snapEnd(ctx, r.comps, r.d)
	if err != nil {
		return err
	}
	attached, _, last := r.attachFigures(idx, created)
	p := &Phase{Name: "attach", Ops: n, CSICalls: int(s1.publishes - s0.publishes)}
	p.WallSeconds = last.Sub(s0.at).Seconds()
	p.PerSecond = float64(len(attached)*sz.IdlePerPod) / p.WallSeconds
	p.P50Ms, p.P99Ms = percentiles(attached)
	p.setWrites(componentWrites(s0, s1), n)
	e.fillUsage(p, s0, s1)
	res.Phases = append(res.Phases, p)
	res.check("volumes attached, Pods Running", fmt.Sprint(n), fmt.Sprint(len(attached)*sz.IdlePerPod), len(attached) == pods, true)
	if waitErr != nil {
		return waitErr
	}

	// At rest: nothing changes for IdleRest. The window opens once the
	// components' trailing writes of the burst (events still queued in a
	// broadcaster, the last Node status) have ended, so it measures rest
	// and not the end of the attach; a component that writes every few
	// seconds never settles and is caught by the window all the same.
	s2, settled, err := e.settle(ctx, r.comps, r.d, 2*time.Second, time.Minute)
	if err != nil {
		return err
	}
	res.Figures["settle_s"] = round2(settled.Seconds())
	select {
	case <-time.After(sz.IdleRest):
	case <-ctx.Done():
		return ctx.Err()
	}
	s3, err := e.snap(ctx, r.comps, r.d)
	if err != nil {
		return err
	}
	rest := &Phase{Name: "rest", Ops: n, WallSeconds: s3.at.Sub(s2.at).Seconds()}
	rest.setWrites(componentWrites(s2, s3), n)
	e.fillUsage(rest, s2, s3)
	res.Phases = append(res.Phases, rest)
	res.Figures["rest_writes"] = float64(rest.Writes.Total())
	res.check("API writes at rest", "0", fmt.Sprint(rest.Writes.Total()), rest.Writes.Total() == 0, true)
	if e.cfg.Launcher.Measured() {
		for name, cpu := range rest.CPUSeconds {
			res.Figures[name+"_rest_cpu_percent_of_core"] = round2(100 * cpu / rest.WallSeconds)
		}
		pct := 100 * rest.CPUSeconds["attachdetach-controller"] / rest.WallSeconds
		res.check("controller CPU at rest", "≤ 1% of one core", fmt.Sprintf("%.2f%%", pct), pct <= 1, false)
	}

	det, left, waitErr, err := r.detachAll(ctx, e, res, "detach", idx, n, s3, sz.StepsTimeout)
	if err != nil {
		return err
	}
	res.check("VolumeAttachments gone after the Pods", "0 left", fmt.Sprintf("%d left", left), left == 0, true)
	res.check("ControllerPublish / Unpublish calls", fmt.Sprintf("= %d / %d", n, n), fmt.Sprintf("%d / %d", p.CSICalls, det.CSICalls), p.CSICalls == n && det.CSICalls == n, true)
	if waitErr != nil {
		return waitErr
	}
	comps := r.comps
	r.comps = nil
	return finalUsage(e, res, comps)
}

// detachAll deletes Pods idx, waits up to timeout for every
// VolumeAttachment but the canary's to be gone and adds a phase of n
// detaches named name; it returns how many VolumeAttachments other than
// the canary's are left.
func (r *podRig) detachAll(ctx context.Context, e *env, res *Result, name string, idx []int, n int, before snapshot, timeout time.Duration) (det *Phase, left int, waitErr, err error) {
	if err := r.deletePods(ctx, idx); err != nil {
		return nil, 0, nil, fmt.Errorf("delete Pods: %w", err)
	}
	waitErr = waitFor(ctx, timeout, "every VolumeAttachment gone", r.allVAsGone)
	after, err := e.snapEnd(ctx, r.comps, r.d)
	if err != nil {
		return nil, 0, nil, err
	}
	det = &Phase{Name: name, Ops: n, CSICalls: int(after.unpublishes - before.unpublishes)}
	det.WallSeconds = after.at.Sub(before.at).Seconds()
	det.PerSecond = float64(n) / det.WallSeconds
	det.setWrites(componentWrites(before, after), n)
	e.fillUsage(det, before, after)
	res.Phases = append(res.Phases, det)
	exist, _ := r.tracker.counts()
	return det, max(0, exist-1), waitErr, nil
}
