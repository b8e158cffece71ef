package bench

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
func (e *env) vaCreators() int { return creatorsOr(e.cfg.Sizes.AttachCreators) }

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
	return r.all(idx, r.tracker.attachedAt)
}

func (r *attachRig) allGone(idx []int) func() bool {
	return r.all(idx, r.tracker.goneAt)
}

// all is a condition: the tracker has a time from at for the VA of every
// PV of idx.
func (r *attachRig) all(idx []int, at func(name string) (time.Time, bool)) func() bool {
	return func() bool {
		for _, i := range idx {
			if _, ok := at(r.pv(i)); !ok {
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
