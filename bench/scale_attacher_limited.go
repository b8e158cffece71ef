package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/latchcsi/latch/internal/app"
)

// attacherLimitedColdStart starts csi-attacher (the binary) a second time,
// as it runs in a container with a memory limit of
// AttacherContainerMemoryMiB: GOMEMLIMIT is the share of it the binary
// takes from its container's limit (app.MemoryLimitRatio), here given
// through the environment because the child runs in the harness's cgroup.
// Every volume's VolumeAttachment is attached, plus one new one: its ready
// time is when the new one is attached; its peak RSS and CPU are read
// half a writes window later (30 s at the full size: its informers'
// initial lists are decoded by then and its heap is at its steady size,
// before its first ListVolumes reconcile). It must publish nothing else and unpublish
// nothing, as in attacherColdStart.
func (e *scaleEnv) attacherLimitedColdStart(ctx context.Context) error {
	limit := e.sz.AttacherContainerMemoryMiB
	if limit <= 0 {
		return nil
	}
	w := e.w
	i := w.volumes + startAttacherLimitedVA
	if err := e.newAttacherVA(ctx, i); err != nil {
		return err
	}
	calls := w.calls()
	goLimit := int(float64(limit) * app.MemoryLimitRatio)
	p, err := e.startColdAttacher(ctx, i, "csi-attacher-limited.log", []string{fmt.Sprintf("GOMEMLIMIT=%dMiB", goLimit)},
		fmt.Sprintf("--max-entries=%d", e.sz.MaxEntries))
	if err != nil {
		return err
	}
	defer p.stop()
	e.rep.Figures["attacher_limited_ready_s"] = round2(time.Since(p.started).Seconds())
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(e.sz.WritesWindow / 2):
	}
	if err := p.alive(); err != nil {
		return err
	}
	u, gc := p.usage(), p.gc()
	others, unpublishes := w.callsSince(calls, w.pv(i))
	e.rep.Figures["attacher_limited_container_memory_mib"] = limit
	e.rep.Figures["attacher_limited_gomemlimit_mib"] = goLimit
	e.rep.Figures["attacher_limited_peak_rss_mb"] = round2(float64(u.PeakRSSBytes) / (1 << 20))
	e.rep.Figures["attacher_limited_cpu_s"] = round2(u.CPUSeconds)
	e.rep.Figures["attacher_limited_gc_cpu_s"] = round2(gc.CPUSeconds)
	e.rep.Figures["attacher_limited_gcs"] = gc.Count
	e.rep.check("csi-attacher in a container's memory limit: no ControllerPublish for an attached VolumeAttachment", "0", fmt.Sprint(others), others == 0)
	e.rep.check("csi-attacher in a container's memory limit: no ControllerUnpublish at start", "0", fmt.Sprint(unpublishes), unpublishes == 0)
	return e.checkNothingDetached(ctx, "csi-attacher in a container's memory limit")
}
