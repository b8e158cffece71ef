package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/kube/kubenames"
)

const benchFieldManager = "latch-bench"

// limitWritesPerAttach is the attach of scenario F: one VA metadata patch,
// one VA status patch, one PV patch.
const limitWritesPerAttach = 3

// limitProbe is one measurement of what the API server absorbs: the
// patch writes per second of an attach's three patch shapes (the better of
// two rounds) and the VolumeAttachment creates per second.
type limitProbe struct {
	writes, creates float64
}

func (l limitProbe) measured() bool { return l.writes > 0 && l.creates > 0 }

// ceiling is the most attaches per second the API server can serve when,
// as in scenarios A and B, each attach also costs it the VolumeAttachment's
// create (made by the harness, outside the component): one create at the
// create rate plus writesPerAttach writes at the write rate. Zero when the
// limit was not measured. It leaves out what else shares the machine
// during a scenario (the component's own CPU, watch fan-out), so it is an
// upper bound.
func (l limitProbe) ceiling(writesPerAttach float64) float64 {
	if !l.measured() || writesPerAttach <= 0 {
		return 0
	}
	return 1 / (1/l.creates + writesPerAttach/l.writes)
}

// betterOf is the limit a scenario is judged against: the higher of the
// probes just before and just after it, rate by rate. A machine that is
// slow through the whole scenario lowers both; a probe that meets a slow
// few seconds of its own lowers only itself. It is the rule F applies to
// its own two rounds: a slow stretch can only lower a measured rate, so
// the higher one is nearer to what the server can do.
func betterOf(before, after limitProbe) limitProbe {
	return limitProbe{writes: max(before.writes, after.writes), creates: max(before.creates, after.creates)}
}

// runWriteLimit is scenario F: how many writes per second the API server takes
// for the patch shapes an attach makes, sent by the harness at high
// concurrency with no controller in between (see probeLimit). An attach
// rate limit is this divided by writes per attach.
func runWriteLimit(ctx context.Context, e *env, res *Result) error {
	l, phases, err := e.probeLimit(ctx)
	res.Phases = append(res.Phases, phases...)
	if err != nil {
		return err
	}
	e.report.LimitWritesPerSecond, e.report.LimitCreatesPerSecond = l.writes, l.creates
	e.limit, e.probed = l, &l
	res.Figures["writes_per_s"] = round2(l.writes)
	res.Figures["attach_limit_per_s_at_3_writes"] = round2(l.writes / limitWritesPerAttach)
	res.Figures["va_creates_per_s"] = round2(l.creates)
	res.Figures["attach_ceiling_per_s_with_creates"] = round2(l.ceiling(limitWritesPerAttach))
	writes := fmt.Sprint(limitWritesPerAttach * 2 * (e.cfg.Sizes.LimitItems / 2))
	res.check("patches accepted", writes, writes, true, true)
	return nil
}

// probeLimit measures the limit once on objects of its own, which it
// removes again (so later scenarios' caches do not hold them): LimitItems PVs
// and VolumeAttachments are created (the VolumeAttachment creates timed),
// then, in two rounds on fresh halves of them, each gets the writes of an
// attach: the VA finalizer+annotations JSON patch guarded by
// resourceVersion, the VA status merge patch and the PV finalizer JSON
// patch. It returns the phases it timed.
func (e *env) probeLimit(ctx context.Context) (l limitProbe, phases []*Phase, err error) {
	sz := e.cfg.Sizes
	e.probes++
	prefix, driver := e.names(ScenarioWriteLimit)
	if e.probes > 1 {
		prefix = fmt.Sprintf("%s-%d", prefix, e.probes)
	}
	name := func(i int) string { return fmt.Sprintf("%s-%05d", prefix, i) }
	pvs := make([]*v1.PersistentVolume, sz.LimitItems)
	vas := make([]*storagev1.VolumeAttachment, sz.LimitItems)
	err = parallel(ctx, sz.LimitItems, createConcurrency, func(ctx context.Context, i int) error {
		pv, err := e.client.CoreV1().PersistentVolumes().Create(ctx, newPV(name(i), driver), metav1.CreateOptions{})
		pvs[i] = pv
		return err
	})
	if err != nil {
		return l, phases, errors.Join(fmt.Errorf("create PersistentVolumes: %w", err), e.removeProbeObjects(ctx, pvs, vas))
	}
	defer func() { err = errors.Join(err, e.removeProbeObjects(ctx, pvs, vas)) }()
	// The VolumeAttachment creates are timed too, with enough in flight to
	// saturate the API server (more than A's and B's creators): a scenario
	// whose burst the harness creates shares the API server with those
	// creates, so its ceiling is below the patch limit (see ceiling).
	start := time.Now()
	err = parallel(ctx, sz.LimitItems, createConcurrency, func(ctx context.Context, i int) error {
		va, err := e.client.StorageV1().VolumeAttachments().Create(ctx, newVA(name(i), driver, name(i), prefix+"-node"), metav1.CreateOptions{})
		vas[i] = va
		return err
	})
	if err != nil {
		return l, phases, fmt.Errorf("create VolumeAttachments: %w", err)
	}
	elapsed := time.Since(start)
	creates := &Phase{Name: fmt.Sprintf("VA creates@%d", createConcurrency), Ops: sz.LimitItems, WallSeconds: elapsed.Seconds(), PerSecond: float64(sz.LimitItems) / elapsed.Seconds()}
	phases = append(phases, creates)

	finalizer, pvFinalizer := kubenames.AttacherFinalizer(driver), kubenames.PVFinalizer(driver)
	opts := metav1.PatchOptions{FieldManager: benchFieldManager}
	attach := func(ctx context.Context, i int) error {
		meta, err := vaMetadataPatch(vas[i], finalizer, map[string]string{
			kubenames.VANodeIDAnnotation: prefix + "-node-id", "attacher.latch.dev/volume-handle": name(i),
		})
		if err != nil {
			return err
		}
		va, err := e.client.StorageV1().VolumeAttachments().Patch(ctx, vas[i].Name, types.JSONPatchType, meta, opts)
		if err != nil {
			return fmt.Errorf("patch VA metadata: %w", err)
		}
		status, err := kube.VolumeAttachmentStatusPatch(va, storagev1.VolumeAttachmentStatus{
			Attached: true, AttachmentMetadata: map[string]string{"devicePath": "/dev/disk/by-id/" + name(i)},
		})
		if err != nil {
			return err
		}
		if vas[i], err = e.client.StorageV1().VolumeAttachments().Patch(ctx, va.Name, types.MergePatchType, status, opts, "status"); err != nil {
			return fmt.Errorf("patch VA status: %w", err)
		}
		pvPatch, err := kube.AddFinalizerPatch(pvs[i], pvFinalizer)
		if err != nil {
			return err
		}
		if pvs[i], err = e.client.CoreV1().PersistentVolumes().Patch(ctx, pvs[i].Name, types.JSONPatchType, pvPatch, opts); err != nil {
			return fmt.Errorf("patch PV: %w", err)
		}
		return nil
	}
	// Two rounds on fresh halves of the objects, at a quarter of the
	// concurrency and at the full one: past the API server's knee more
	// writers only queue, so the better round is the limit.
	half := sz.LimitItems / 2
	for round, conc := range []int{max(1, sz.LimitConcurrency/4), sz.LimitConcurrency} {
		from := round * half
		start := time.Now()
		err := parallel(ctx, half, conc, func(ctx context.Context, i int) error { return attach(ctx, from+i) })
		elapsed := time.Since(start)
		if err != nil {
			return l, phases, err
		}
		writes := limitWritesPerAttach * half
		p := &Phase{Name: fmt.Sprintf("patches@%d", conc), Ops: writes, WallSeconds: elapsed.Seconds(), PerSecond: float64(writes) / elapsed.Seconds()}
		phases = append(phases, p)
		l.writes = max(l.writes, p.PerSecond)
	}
	l.creates = creates.PerSecond
	return l, phases, nil
}

// removeProbeObjects deletes what probeLimit created, finalizers first,
// so that later scenarios' caches do not hold it.
func (e *env) removeProbeObjects(ctx context.Context, pvs []*v1.PersistentVolume, vas []*storagev1.VolumeAttachment) error {
	vaAPI, pvAPI := e.client.StorageV1().VolumeAttachments(), e.client.CoreV1().PersistentVolumes()
	if err := removeAll(ctx, "VolumeAttachment", vas, vaAPI.Patch, vaAPI.Delete); err != nil {
		return err
	}
	return removeAll(ctx, "PersistentVolume", pvs, pvAPI.Patch, pvAPI.Delete)
}

// removeAll clears the finalizers of the created objects among objs (nil
// where a create failed) and deletes them; objects already gone are fine.
func removeAll[O any, P interface {
	*O
	metav1.Object
}, R any](ctx context.Context, kind string, objs []P,
	patch func(context.Context, string, types.PatchType, []byte, metav1.PatchOptions, ...string) (R, error),
	del func(context.Context, string, metav1.DeleteOptions) error) error {
	unfinalize := []byte(`{"metadata":{"finalizers":null}}`)
	opts := metav1.PatchOptions{FieldManager: benchFieldManager}
	err := parallel(ctx, len(objs), createConcurrency, func(ctx context.Context, i int) error {
		if objs[i] == nil {
			return nil
		}
		name := objs[i].GetName()
		if _, err := patch(ctx, name, types.MergePatchType, unfinalize, opts); ignoreNotFound(err) != nil {
			return fmt.Errorf("remove the finalizers of %s %s: %w", kind, name, err)
		}
		return ignoreNotFound(del(ctx, name, metav1.DeleteOptions{}))
	})
	if err != nil {
		return fmt.Errorf("clean up: %w", err)
	}
	return nil
}

// vaMetadataPatch is the attacher's metadata write: one JSON patch that
// tests resourceVersion, adds the finalizer and sets annotations.
func vaMetadataPatch(va *storagev1.VolumeAttachment, finalizer string, annotations map[string]string) ([]byte, error) {
	fin, err := kube.AddFinalizerPatch(va, finalizer)
	if err != nil {
		return nil, err
	}
	ann, err := kube.SetAnnotationsPatch(va, annotations)
	if err != nil {
		return nil, err
	}
	var a, b []json.RawMessage
	if err := json.Unmarshal(fin, &a); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(ann, &b); err != nil {
		return nil, err
	}
	return json.Marshal(append(a, b[1:]...)) // one resourceVersion test
}

// limitBefore is the limit just before a judged scenario (A, D) starts
// anything: the probe the scenario before it ended with, when there is
// one, or a new probe. It measures nothing when F did not run; the
// scenario then reports no share of a limit.
func (e *env) limitBefore(ctx context.Context, res *Result) (limitProbe, error) {
	if e.report.LimitWritesPerSecond <= 0 {
		return limitProbe{}, nil
	}
	if e.previous != nil {
		e.limit = *e.previous
		return *e.previous, nil
	}
	l, err := e.probeRow(ctx, res, "limit before")
	if err != nil {
		return l, fmt.Errorf("measure the limit before %s: %w", res.Scenario, err)
	}
	e.limit = l
	return l, nil
}

// limitAround probes the limit again once a judged scenario has stopped
// its components, and makes the better of that and before the limit the
// scenario is judged against, recording both and how far the machine
// drifted between them.
func (e *env) limitAround(ctx context.Context, res *Result, before limitProbe) error {
	if !before.measured() {
		return nil
	}
	res.Figures["limit_before_writes_per_s"] = round2(before.writes)
	after, err := e.probeRow(ctx, res, "limit after")
	if err != nil {
		e.limit = before
		return fmt.Errorf("measure the limit after %s (judged against the limit before it): %w", res.Scenario, err)
	}
	e.probed = &after
	e.limit = betterOf(before, after)
	res.Figures["limit_after_writes_per_s"] = round2(after.writes)
	res.Figures["limit_writes_per_s"] = round2(e.limit.writes)
	res.Figures["limit_creates_per_s"] = round2(e.limit.creates)
	res.Figures["limit_drift_percent"] = round2(100 * (after.writes - before.writes) / before.writes)
	if note := driftNote(res.Scenario, before.writes, after.writes); note != "" {
		res.Notes = append(res.Notes, note)
	}
	return nil
}

// driftNote warns when the probes around a scenario disagree by
// driftWarnPercent or more, and is empty otherwise.
func driftNote(scenario string, before, after float64) string {
	drift := 100 * (after - before) / before
	if math.Abs(drift) < driftWarnPercent {
		return ""
	}
	return fmt.Sprintf("the limit probes around %s disagree by %+.0f%% (%.0f before, %.0f after, writes/s): the machine's speed moved "+
		"while it ran, so its shares of the limit and its latencies are less certain than usual; run it again before drawing conclusions",
		scenario, drift, before, after)
}

// driftWarnPercent is how far the probes around a scenario may disagree
// before its result carries a note. Probes taken one after another with
// nothing running between them have mostly differed by less.
const driftWarnPercent = 20

// probeRow probes the limit and adds one row for it to res: the round
// whose patch writes set the limit.
func (e *env) probeRow(ctx context.Context, res *Result, name string) (limitProbe, error) {
	l, phases, err := e.probeLimit(ctx)
	if i := slices.IndexFunc(phases, func(p *Phase) bool { return l.writes > 0 && p.PerSecond == l.writes }); i >= 0 {
		row := *phases[i]
		row.Name = name
		res.Phases = append(res.Phases, &row)
	}
	return l, err
}

// limitNote says, for a rate check, which limit the rate was compared
// with: F's alone, or the better of the probes around the scenario.
func limitNote(res *Result) string {
	after, ok := res.Figures["limit_after_writes_per_s"]
	if !ok {
		return ""
	}
	return fmt.Sprintf("; limit %.0f writes/s, the higher of %.0f before and %.0f after",
		res.Figures["limit_writes_per_s"], res.Figures["limit_before_writes_per_s"], after)
}
