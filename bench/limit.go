package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/latchcsi/latch/internal/kube"
)

const benchFieldManager = "latch-bench"

// limitWritesPerAttach is the attach of scenario F: one VA metadata patch,
// one VA status patch, one PV patch.
const limitWritesPerAttach = 3

// runLimit is scenario F: how many writes per second the API server takes
// for the patch shapes an attach makes (VA finalizer+annotations JSON patch
// guarded by resourceVersion, VA status merge patch, PV finalizer JSON
// patch), sent by the harness at high concurrency with no controller in
// between. An attach rate limit is this divided by writes per attach.
func runLimit(ctx context.Context, e *env, res *Result) error {
	sz := e.cfg.Sizes
	prefix, driver := e.names("F")
	name := func(i int) string { return fmt.Sprintf("%s-%05d", prefix, i) }
	pvs := make([]*v1.PersistentVolume, sz.FItems)
	vas := make([]*storagev1.VolumeAttachment, sz.FItems)
	err := parallel(ctx, sz.FItems, createConcurrency, func(ctx context.Context, i int) error {
		pv, err := e.client.CoreV1().PersistentVolumes().Create(ctx, newPV(name(i), driver), metav1.CreateOptions{})
		pvs[i] = pv
		return err
	})
	if err != nil {
		return fmt.Errorf("create PersistentVolumes: %w", err)
	}
	// The VolumeAttachment creates are timed too, with enough in flight to
	// saturate the API server (more than A's and B's creators): a scenario
	// whose burst the harness creates shares the API server with those
	// creates, so its ceiling is below the patch limit (see attachCeiling).
	start := time.Now()
	err = parallel(ctx, sz.FItems, createConcurrency, func(ctx context.Context, i int) error {
		va, err := e.client.StorageV1().VolumeAttachments().Create(ctx, newVA(name(i), driver, name(i), prefix+"-node"), metav1.CreateOptions{})
		vas[i] = va
		return err
	})
	if err != nil {
		return fmt.Errorf("create VolumeAttachments: %w", err)
	}
	elapsed := time.Since(start)
	creates := &Phase{Name: fmt.Sprintf("VA creates@%d", createConcurrency), Ops: sz.FItems, WallSeconds: elapsed.Seconds(), PerSecond: float64(sz.FItems) / elapsed.Seconds()}
	res.Phases = append(res.Phases, creates)
	e.report.LimitCreatesPerSecond = creates.PerSecond

	finalizer, pvFinalizer := kube.AttacherFinalizer(driver), kube.PVFinalizer(driver)
	opts := metav1.PatchOptions{FieldManager: benchFieldManager}
	attach := func(ctx context.Context, i int) error {
		meta, err := vaMetadataPatch(vas[i], finalizer, map[string]string{
			kube.VANodeIDAnnotation: prefix + "-node-id", "attacher.latch.dev/volume-handle": name(i),
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
		if _, err := e.client.CoreV1().PersistentVolumes().Patch(ctx, pvs[i].Name, types.JSONPatchType, pvPatch, opts); err != nil {
			return fmt.Errorf("patch PV: %w", err)
		}
		return nil
	}
	// Two rounds on fresh halves of the objects, at a quarter of the
	// concurrency and at the full one: past the API server's knee more
	// writers only queue, so the better round is the limit.
	half := sz.FItems / 2
	for round, conc := range []int{max(1, sz.FConcurrency/4), sz.FConcurrency} {
		from := round * half
		start := time.Now()
		err := parallel(ctx, half, conc, func(ctx context.Context, i int) error { return attach(ctx, from+i) })
		elapsed := time.Since(start)
		if err != nil {
			return err
		}
		writes := limitWritesPerAttach * half
		p := &Phase{Name: fmt.Sprintf("patches@%d", conc), Ops: writes, WallSeconds: elapsed.Seconds(), PerSecond: float64(writes) / elapsed.Seconds()}
		res.Phases = append(res.Phases, p)
		e.report.LimitWritesPerSecond = max(e.report.LimitWritesPerSecond, p.PerSecond)
	}
	res.Figures["writes_per_s"] = round2(e.report.LimitWritesPerSecond)
	res.Figures["attach_limit_per_s_at_3_writes"] = round2(e.report.LimitWritesPerSecond / limitWritesPerAttach)
	res.Figures["va_creates_per_s"] = round2(e.report.LimitCreatesPerSecond)
	if c := attachCeiling(e.report, limitWritesPerAttach); c > 0 {
		res.Figures["attach_ceiling_per_s_with_creates"] = round2(c)
	}
	res.check("patches accepted", fmt.Sprint(limitWritesPerAttach*2*half), fmt.Sprint(limitWritesPerAttach*2*half), true, true)

	// Leave no VolumeAttachment behind for later scenarios' caches.
	return parallel(ctx, 2*half, createConcurrency, func(ctx context.Context, i int) error {
		patch, err := kube.RemoveFinalizerPatch(vas[i], finalizer)
		if err != nil {
			return err
		}
		if patch != nil {
			if _, err := e.client.StorageV1().VolumeAttachments().Patch(ctx, vas[i].Name, types.JSONPatchType, patch, opts); err != nil {
				return fmt.Errorf("clean up: %w", err)
			}
		}
		return ignoreNotFound(e.client.StorageV1().VolumeAttachments().Delete(ctx, vas[i].Name, metav1.DeleteOptions{}))
	})
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

// attachCeiling is the most attaches per second the API server can serve
// when, as in scenarios A and B, each attach also costs it the
// VolumeAttachment's create (made by the harness, outside the component):
// one create at F's create rate plus writesPerAttach writes at F's write
// rate. Zero when F did not run. It leaves out what else shares the
// machine during a scenario (the component's own CPU, watch fan-out), so
// it is an upper bound.
func attachCeiling(r *Report, writesPerAttach float64) float64 {
	if r.LimitWritesPerSecond <= 0 || r.LimitCreatesPerSecond <= 0 || writesPerAttach <= 0 {
		return 0
	}
	return 1 / (1/r.LimitCreatesPerSecond + writesPerAttach/r.LimitWritesPerSecond)
}
