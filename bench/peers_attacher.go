package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/latchcsi/latch/internal/csimock"
)

// peerLauncher starts one contender's components: the bench's rigs call
// it as they call make bench's launchers.
type peerLauncher struct {
	attacher   func(ctx context.Context, csiAddress string) (Component, error)
	controller func(ctx context.Context) (Component, error)
}

var _ Launcher = (*peerLauncher)(nil)

func (l *peerLauncher) StartAttacher(ctx context.Context, csiAddress string) (Component, error) {
	return l.attacher(ctx, csiAddress)
}

func (l *peerLauncher) StartController(ctx context.Context) (Component, error) {
	if l.controller == nil {
		return nil, errors.New("no controller in this workload")
	}
	return l.controller(ctx)
}

// Measured is true: the contender runs as a child process.
func (*peerLauncher) Measured() bool { return true }

// processes is the child-process starter of a run (logs numbered in
// LogDir).
func (cfg *PeersConfig) processes() *Processes {
	return &Processes{Kubeconfig: cfg.Kubeconfig, LogDir: cfg.LogDir}
}

// attacherTotal is how many PVs a contender's attacher run uses.
func attacherTotal(sz PeerSizes, a PeerAttacher, profiles []string) int {
	n := 0
	if a.Latency {
		n += sz.Paced + sz.Saturated
	}
	if a.Backends {
		for _, p := range profiles {
			n += sz.Backend[p]
		}
	}
	return n
}

// runPeerAttacher runs one attacher contender's workloads with one
// process of it: a canary volume, then (Latency) VolumeAttachments
// created at a fixed rate below saturation and deleted at that rate,
// then a burst created at once and deleted at once, then (Backends) a
// burst per backend profile.
func runPeerAttacher(ctx context.Context, e *env, cfg *PeersConfig, a PeerAttacher, run *PeerRun, scenario string) error {
	sz := cfg.Sizes
	procs := cfg.processes()
	e.cfg.Launcher = &peerLauncher{attacher: func(ctx context.Context, addr string) (Component, error) {
		args := append([]string{"--csi-address=" + addr, "--kubeconfig=" + cfg.Kubeconfig}, a.Args...)
		return procs.start(ctx, "csi-attacher-"+slug(a.Name), a.Binary, args...)
	}}
	total := attacherTotal(sz, a, cfg.Profiles)
	r, err := e.newAttachRig(ctx, scenario, sz.Nodes, total, false)
	if err != nil {
		return err
	}
	defer func() {
		r.close()
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		if err := e.clearDriverObjects(cctx, r.driver, r.prefix); err != nil && run.Error == "" {
			run.Error = "clean up: " + err.Error()
		}
	}()
	if err := r.canary(ctx); err != nil {
		return err
	}
	next := 0
	take := func(n int) []int { idx := span(n, next); next += n; return idx }
	if a.Latency {
		if err := r.latencyWorkloads(ctx, e, cfg, a, run, take(sz.Paced), take(sz.Saturated)); err != nil {
			return err
		}
	}
	if a.Backends {
		for _, p := range cfg.Profiles {
			if err := r.backendWorkload(ctx, e, cfg, run, p, take(sz.Backend[p])); err != nil {
				return fmt.Errorf("backend %s: %w", p, err)
			}
		}
	}
	return nil
}

// latencyWorkloads runs the paced and the saturating workload and records
// their latencies, publishes per VolumeAttachment, writes per operation,
// and the attacher's CPU and peak RSS over both.
func (r *attachRig) latencyWorkloads(ctx context.Context, e *env, cfg *PeersConfig, a PeerAttacher, run *PeerRun, paced, saturated []int) error {
	sz := cfg.Sizes
	s0, err := e.snap(ctx, r.comps(), r.d)
	if err != nil {
		return err
	}
	attachWrites, detachWrites := Writes{}, Writes{}
	attached, gone := 0, 0
	for _, w := range []struct {
		name string
		idx  []int
		do   func(idx []int, del bool) ([]time.Time, error)
	}{
		{"paced", paced, func(idx []int, del bool) ([]time.Time, error) { return r.pacedVAs(ctx, idx, sz.PacedRate, del) }},
		{"saturated", saturated, func(idx []int, del bool) ([]time.Time, error) {
			if del {
				return r.deleteVAs(ctx, idx, sz.Creators)
			}
			return r.createVAs(ctx, idx, sz.Creators)
		}},
	} {
		before, err := e.snap(ctx, r.comps(), r.d)
		if err != nil {
			return err
		}
		created, err := w.do(w.idx, false)
		if err != nil {
			return fmt.Errorf("%s: create VolumeAttachments: %w", w.name, err)
		}
		waitErr := waitFor(ctx, sz.Timeout, w.name+": every VolumeAttachment attached", r.allAttached(w.idx))
		mid, err := e.snap(ctx, r.comps(), r.d)
		if err != nil {
			return err
		}
		lat, last := r.attachedLatencies(w.idx, created)
		attached += len(lat)
		run.Figures["attach_"+w.name+"_p50_ms"], run.Figures["attach_"+w.name+"_p99_ms"] = percentiles(lat)
		if d := last.Sub(before.at).Seconds(); d > 0 {
			run.Figures["attach_"+w.name+"_per_s"] = round2(float64(len(lat)) / d)
		}
		addWrites(attachWrites, componentWrites(before, mid))
		if waitErr != nil {
			return waitErr
		}
		deleted, err := w.do(w.idx, true)
		if err != nil {
			return fmt.Errorf("%s: delete VolumeAttachments: %w", w.name, err)
		}
		waitErr = waitFor(ctx, sz.Timeout, w.name+": every VolumeAttachment gone", r.allGone(w.idx))
		after, err := e.snap(ctx, r.comps(), r.d)
		if err != nil {
			return err
		}
		lat, _ = r.goneLatencies(w.idx, deleted)
		gone += len(lat)
		run.Figures["detach_"+w.name+"_p50_ms"], run.Figures["detach_"+w.name+"_p99_ms"] = percentiles(lat)
		addWrites(detachWrites, componentWrites(mid, after))
		if waitErr != nil {
			return waitErr
		}
	}
	s1, err := e.snap(ctx, r.comps(), r.d)
	if err != nil {
		return err
	}
	n := len(paced) + len(saturated)
	publishes := float64(s1.publishes-s0.publishes) / float64(n)
	run.Figures["publishes_per_va"] = publishes
	run.Figures["unpublishes_per_va"] = float64(s1.unpublishes-s0.unpublishes) / float64(n)
	run.Figures["duplicate_publishes"] = float64(s1.duplicates - s0.duplicates)
	run.Figures["writes_per_attach"] = round2(float64(attachWrites.Total()) / float64(n))
	run.Figures["writes_per_detach"] = round2(float64(detachWrites.Total()) / float64(n))
	u0, u1 := s0.usage["csi-attacher"], s1.usage["csi-attacher"]
	run.Figures["cpu_s"] = round2(u1.CPUSeconds - u0.CPUSeconds)
	run.Figures["peak_rss_mb"] = round2(float64(u1.PeakRSSBytes) / (1 << 20))
	run.check("VolumeAttachments attached", fmt.Sprint(n), fmt.Sprint(attached), attached == n)
	run.check("VolumeAttachments gone after their delete", fmt.Sprint(n), fmt.Sprint(gone), gone == n)
	if a.Latch {
		run.check("ControllerPublish calls per VolumeAttachment", "1.000", fmt.Sprintf("%.3f", publishes), s1.publishes-s0.publishes == int64(n))
	}
	r.singleNodeCheck(run)
	return nil
}

// singleNodeCheck fails the run when the driver ever had a single-node
// volume published to two nodes at once.
func (r *attachRig) singleNodeCheck(run *PeerRun) {
	st := r.d.Stats().Publish
	run.check("no single-node volume on two nodes at once", "0 violations, at most 1 node",
		fmt.Sprintf("%d violations, at most %d node(s)", st.SingleNodeViolationsTotal, st.MaxSingleNodePublishedNodes),
		st.SingleNodeViolationsTotal == 0 && st.MaxSingleNodePublishedNodes <= 1)
}

// backendWorkload puts the driver behind backend profile and runs a burst
// of VolumeAttachments through it: all created at once, then, once all
// are attached or the budget (Sizes.BackendBudget) is spent, all deleted
// at once. Throughput is the publishes and unpublishes completed over the
// time from the first create to the last VolumeAttachment gone (or to the
// end of the budget), as a share of what the backend can serve
// (BackendStats.OpsPerSecond, sampled every 100 ms over the same time,
// since a profile's phases change it); throttled calls as a share of all
// calls the backend was asked. A burst not served within the budget is
// recorded (unfinished operations, a failed check) and its leftover
// VolumeAttachments are removed, so the next profile starts clean.
func (r *attachRig) backendWorkload(ctx context.Context, e *env, cfg *PeersConfig, run *PeerRun, profile string, idx []int) error {
	sz := cfg.Sizes
	b, err := csimock.ProfileBackend(profile)
	if err != nil {
		return err
	}
	r.d.ClearFaults()
	b.Seed = sz.BackendSeed
	if err := r.d.SetBackend(&b); err != nil {
		return err
	}
	defer func() { _ = r.d.SetBackend(nil) }()
	samples := sampleCapacity(r.d)
	start := time.Now()
	deadline := start.Add(sz.BackendBudget)
	created, err := r.createVAs(ctx, idx, sz.Creators)
	if err != nil {
		samples()
		return fmt.Errorf("create VolumeAttachments: %w", err)
	}
	_ = waitFor(ctx, max(time.Until(deadline), 0), "every VolumeAttachment attached", r.allAttached(idx))
	lat, lastAttached := r.attachedLatencies(idx, created)
	attached := len(lat)
	p := "backend_" + profile + "_"
	if attached == len(idx) {
		// (Over part of the burst they would hide its slowest attaches.)
		run.Figures[p+"attach_p50_ms"], run.Figures[p+"attach_p99_ms"] = percentiles(lat)
	}
	deleted, err := r.deleteVAs(ctx, idx, sz.Creators)
	if err != nil {
		samples()
		return fmt.Errorf("delete VolumeAttachments: %w", err)
	}
	_ = waitFor(ctx, max(time.Until(deadline), 0), "every VolumeAttachment gone", r.allGone(idx))
	glat, lastGone := r.goneLatencies(idx, deleted)
	capacity := samples()
	st, _ := r.d.BackendStats()
	n := len(idx)
	end := lastGone
	if end.IsZero() {
		end = lastAttached
	}
	ops := attached + len(glat)
	unfinished := 2*n - ops
	if unfinished > 0 && ctx.Err() == nil {
		end = deadline
	}
	if wall := end.Sub(start).Seconds(); wall > 0 && capacity > 0 {
		perSecond := float64(ops) / wall
		run.Figures[p+"ops_per_s"] = round2(perSecond)
		run.Figures[p+"capacity_ops_per_s"] = round2(capacity)
		run.Figures[p+"capacity_percent"] = round2(100 * perSecond / capacity)
		run.Figures[p+"wall_s"] = round2(wall)
	}
	run.Figures[p+"unfinished_ops"] = float64(unfinished)
	if calls := st.Served + st.Throttled; calls > 0 {
		run.Figures[p+"throttled_percent"] = round2(100 * float64(st.Throttled) / float64(calls))
	}
	run.Figures[p+"calls"] = float64(st.Served + st.Throttled)
	want := fmt.Sprintf("%d within %s", n, sz.BackendBudget)
	run.check(profile+": VolumeAttachments attached", want, fmt.Sprint(attached), attached == n)
	run.check(profile+": VolumeAttachments gone after their delete", want, fmt.Sprint(len(glat)), len(glat) == n)
	r.singleNodeCheck(run)
	if err := ctx.Err(); err != nil {
		return err
	}
	if unfinished > 0 {
		fmt.Fprintf(cfg.Out, "%s: %s: %d of %d attaches and detaches not done within %s (%d of %d attached); removing its VolumeAttachments\n",
			run.Contender, profile, unfinished, 2*n, sz.BackendBudget, attached, n)
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		names := make([]string, len(idx))
		for k, i := range idx {
			names[k] = r.pv(i)
		}
		if err := e.removeVAs(cctx, names); err != nil {
			return fmt.Errorf("remove the VolumeAttachments left after the budget: %w", err)
		}
	}
	return nil
}

// sampleCapacity samples d's backend capacity (OpsPerSecond) every
// 100 ms until the returned function is called, which returns their mean.
func sampleCapacity(d *csimock.Driver) func() float64 {
	stop := make(chan struct{})
	var mu sync.Mutex
	var sum float64
	var n int
	take := func() {
		if st, ok := d.BackendStats(); ok {
			mu.Lock()
			sum += st.OpsPerSecond
			n++
			mu.Unlock()
		}
	}
	take()
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				take()
			}
		}
	}()
	return sync.OnceValue(func() float64 {
		close(stop)
		<-done
		take()
		mu.Lock()
		defer mu.Unlock()
		return sum / float64(n)
	})
}

// pacedVAs creates (or, del, deletes) the VolumeAttachments of PVs idx at
// rate a second, each call at its own scheduled time whatever the calls
// before it take, and returns when each call returned.
func (r *attachRig) pacedVAs(ctx context.Context, idx []int, rate float64, del bool) ([]time.Time, error) {
	at := make([]time.Time, len(idx))
	err := paced(ctx, len(idx), rate, func(ctx context.Context, k int) error {
		i := idx[k]
		var err error
		if del {
			err = ignoreNotFound(r.e.client.StorageV1().VolumeAttachments().Delete(ctx, r.pv(i), metav1.DeleteOptions{}))
		} else {
			_, err = r.e.client.StorageV1().VolumeAttachments().Create(ctx, newVA(r.pv(i), r.driver, r.pv(i), r.node(i)), metav1.CreateOptions{})
		}
		at[k] = time.Now()
		return err
	})
	return at, err
}

// paced calls f(0..n-1), call i at i/rate seconds after the start, each
// in a goroutine of its own (an open arrival process: a slow call does
// not delay the next), and returns the first error once all returned.
func paced(ctx context.Context, n int, rate float64, f func(ctx context.Context, i int) error) error {
	start := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for i := range n {
		due := start.Add(time.Duration(float64(i) / rate * float64(time.Second)))
		if d := time.Until(due); d > 0 {
			select {
			case <-ctx.Done():
				wg.Wait()
				return ctx.Err()
			case <-time.After(d):
			}
		}
		wg.Go(func() {
			if err := f(ctx, i); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return first
}

func addWrites(into, w Writes) {
	for k, v := range w {
		into[k] += v
	}
}

// noFinalizers is a merge patch that drops every finalizer.
var noFinalizers = []byte(`{"metadata":{"finalizers":null}}`)

// removeVAs removes the VolumeAttachments names, whatever holds them:
// their finalizers are dropped, then they are deleted.
func (e *env) removeVAs(ctx context.Context, names []string) error {
	err := parallel(ctx, len(names), createConcurrency, func(ctx context.Context, i int) error {
		if _, err := e.client.StorageV1().VolumeAttachments().Patch(ctx, names[i], types.MergePatchType, noFinalizers, metav1.PatchOptions{}); err != nil {
			return ignoreNotFound(err)
		}
		return ignoreNotFound(e.client.StorageV1().VolumeAttachments().Delete(ctx, names[i], metav1.DeleteOptions{}))
	})
	if err != nil {
		return fmt.Errorf("remove VolumeAttachments: %w", err)
	}
	return nil
}

// clearDriverObjects removes what a contender's run left of driver's
// objects once its components are stopped: VolumeAttachments and PVs
// (their finalizers first; nothing runs that would remove them), and
// Nodes and CSINodes named with prefix. The next contender's caches then
// hold only its own objects.
func (e *env) clearDriverObjects(ctx context.Context, driver, prefix string) error {
	vas, err := e.admin.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	var vaNames []string
	for _, va := range vas.Items {
		if va.Spec.Attacher == driver {
			vaNames = append(vaNames, va.Name)
		}
	}
	if err := e.removeVAs(ctx, vaNames); err != nil {
		return err
	}
	pvs, err := e.admin.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	var pvNames []string
	held := map[string]bool{}
	for _, pv := range pvs.Items {
		if pv.Spec.CSI != nil && pv.Spec.CSI.Driver == driver {
			pvNames = append(pvNames, pv.Name)
			held[pv.Name] = len(pv.Finalizers) > 0
		}
	}
	err = parallel(ctx, len(pvNames), createConcurrency, func(ctx context.Context, i int) error {
		if held[pvNames[i]] {
			if _, err := e.client.CoreV1().PersistentVolumes().Patch(ctx, pvNames[i], types.MergePatchType, noFinalizers, metav1.PatchOptions{}); err != nil {
				return ignoreNotFound(err)
			}
		}
		return ignoreNotFound(e.client.CoreV1().PersistentVolumes().Delete(ctx, pvNames[i], metav1.DeleteOptions{}))
	})
	if err != nil {
		return fmt.Errorf("remove PersistentVolumes: %w", err)
	}
	csiNodes, err := e.admin.StorageV1().CSINodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, cn := range csiNodes.Items {
		if strings.HasPrefix(cn.Name, prefix+"-") {
			if err := ignoreNotFound(e.client.StorageV1().CSINodes().Delete(ctx, cn.Name, metav1.DeleteOptions{})); err != nil {
				return err
			}
		}
	}
	nodes, err := e.admin.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, n := range nodes.Items {
		if strings.HasPrefix(n.Name, prefix+"-") {
			if err := ignoreNotFound(e.client.CoreV1().Nodes().Delete(ctx, n.Name, metav1.DeleteOptions{})); err != nil {
				return err
			}
		}
	}
	return nil
}
