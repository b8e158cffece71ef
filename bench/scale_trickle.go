package bench

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// trickleLag is how old a trickle Pod is, at least, when it is deleted.
const trickleLag = 5 * time.Second

// trickleAhead is how many trickle volumes (bound PVC/PV pairs) are
// created ahead of their Pods.
const trickleAhead = 3

// tricklePod is one Pod of the trickle, with its own volume.
type tricklePod struct {
	i       int // its volume's index
	at      placement
	created time.Time
	deleted bool
}

// trickle is the steady state with a trickle (issue 23 step 2): for
// TrickleWindow the harness creates, once a second, one Pod with its own
// new bound PVC/PV on a healthy node and deletes the oldest trickle Pod
// that is at least trickleLag old and whose volume was seen attached (the
// kubelet stand-in walks both). Measured over the window: the
// controller's CPU and RSS, every API request the API server served, the
// controller's writes; and per Pod the time from its creation to its
// volume's VolumeAttachment attached and the volume in its node's status.
// Afterwards the remaining trickle Pods are deleted, and every trickle
// volume must have been attached and, at the end, be detached.
func (e *scaleEnv) trickle(ctx context.Context, p *scaleProc, which, prefix string, aw *attachWatcher, attWrites *writeCounter) error {
	w := e.w
	var pods []*tricklePod
	oldest, skipped := 0, 0
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	// Each Pod's PVC/PV is created before the Pod (a few seconds ahead),
	// as a Pod reaches a node only once its claim is bound:
	// kube-controller-manager has no PersistentVolume handler, so a Pod
	// whose PV its cache has not seen yet waits for the desired-state
	// populator's rescan (up to 3 minutes, docs/scale.md).
	prepare := func() (*tricklePod, error) {
		i := int(w.extra.Add(1)) - 1
		tp := &tricklePod{i: i, at: placement{pv: w.pv(i), node: w.nodeName(i % w.healthyNodes())}}
		if err := w.createVolume(ctx, i, false); err != nil {
			return nil, fmt.Errorf("trickle volume %s: %w", w.pv(i), err)
		}
		return tp, nil
	}
	// The volumes are prepared ahead, beside the ticks: on a loaded API
	// server their three writes made a tick overrun its second, and the
	// trickle of the third full run ran 450 s for its 360 Pods.
	prepCtx, stopPrep := context.WithCancel(ctx)
	defer stopPrep()
	prepared, prepErr, prepDone := make(chan *tricklePod, trickleAhead), make(chan error, 1), make(chan struct{})
	go func() {
		defer close(prepDone)
		for {
			tp, err := prepare()
			if err != nil {
				prepErr <- err
				return
			}
			select {
			case prepared <- tp:
			case <-prepCtx.Done():
				return
			}
		}
	}()
	next := func() (*tricklePod, error) {
		select {
		case tp := <-prepared:
			return tp, nil
		case err := <-prepErr:
			return nil, err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	// The first volume is ready before the window starts.
	first, err := next()
	if err != nil {
		return err
	}
	<-tick.C
	from, err := e.mark(ctx, p, attWrites)
	if err != nil {
		return err
	}
	began := from.at
	// One Pod a second for TrickleWindow: a tick that overruns its second
	// delays the next Pod, it does not stretch the window.
	for tp := first; time.Since(began) < e.sz.TrickleWindow; {
		if tp == nil {
			if tp, err = next(); err != nil {
				return err
			}
		}
		tp.created = time.Now()
		if err := w.createPodOn(ctx, w.pod(tp.i), w.pv(tp.i), tp.at.node); err != nil {
			return fmt.Errorf("trickle pod %s: %w", w.pod(tp.i), err)
		}
		pods = append(pods, tp)
		tp = nil
		if o := pods[oldest]; oldest < len(pods)-1 {
			if _, ok := aw.attachedAt(o.at); ok && time.Since(o.created) >= trickleLag {
				if err := e.deletePod(ctx, w.pod(o.i)); err != nil {
					return err
				}
				o.deleted = true
				oldest++
			} else if time.Since(o.created) >= trickleLag {
				skipped++ // not attached yet: the deletion waits a second
			}
		}
		if err := p.alive(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	// No harness write may be in flight when the window's writes are
	// counted: the API server's counters and the harness's own would
	// disagree by it, and the difference would count as the controller's.
	stopPrep()
	<-prepDone
	rss := p.rssBytes()
	to, err := e.mark(ctx, p, attWrites)
	if err != nil {
		return err
	}
	win := window{from, to}
	deletedInWindow := oldest
	e.rep.Figures[prefix+"controller_trickle_cpu_percent"] = win.cpuPercent()
	e.rep.Figures[prefix+"controller_trickle_rss_mb"] = round2(float64(rss) / (1 << 20))
	e.rep.Figures[prefix+"trickle_api_requests_per_minute"] = win.requestsPerMinute()
	writes := win.writes()
	e.rep.Figures[prefix+"controller_trickle_writes_per_minute"] = win.perMinute(writes.Total())
	e.rep.Figures[prefix+"controller_trickle_writes_by_kind"] = writes
	e.rep.Figures[prefix+"trickle_pods_created"] = len(pods)
	e.rep.Figures[prefix+"trickle_pods_deleted_in_window"] = deletedInWindow
	e.rep.Figures[prefix+"trickle_deletes_deferred"] = skipped

	// Every trickle Pod's volume attached (those created last may still be
	// on their way).
	vols := make([]awaited, len(pods))
	for k, tp := range pods {
		vols[k] = awaited{at: tp.at, since: tp.created}
	}
	got, lat, _ := e.waitAttached(ctx, p, aw, "every trickle Pod's volume attached", vols)
	p50, p99 := percentiles(lat)
	e.rep.Figures[prefix+"trickle_attach_p50_s"] = round2(p50 / 1000)
	e.rep.Figures[prefix+"trickle_attach_p99_s"] = round2(p99 / 1000)
	e.rep.check(which+": every trickle Pod's volume attached (VolumeAttachment attached, volume in its node's status)",
		fmt.Sprint(len(pods)), fmt.Sprint(got), got == len(pods) && len(pods) > 0)

	// The rest go too; then nothing of the trickle may stay attached.
	for _, tp := range pods[oldest:] {
		if err := e.deletePod(ctx, w.pod(tp.i)); err != nil {
			return err
		}
		tp.deleted = true
	}
	leaked := func() []string {
		var out []string
		for _, tp := range pods {
			if !aw.detached(tp.at) {
				out = append(out, tp.at.pv+" on "+tp.at.node)
			}
		}
		return out
	}
	_ = p.waitUntil(ctx, e.sz.ActionTimeout, "every trickle volume detached", func(context.Context) bool { return len(leaked()) == 0 })
	left := leaked()
	e.rep.check(which+": every deleted trickle Pod's volume detached (VolumeAttachment gone, volume not in its node's status)",
		"0 left", fmt.Sprintf("%d left %v", len(left), trim(left, 5)), len(left) == 0)
	return nil
}

// deletePod deletes a Pod as a user would (the kubelet stand-in finishes
// the deletion once its volumes are out of volumesInUse).
func (e *scaleEnv) deletePod(ctx context.Context, name string) error {
	if err := e.client.CoreV1().Pods(e.w.ns).Delete(ctx, name, metav1.DeleteOptions{}); ignoreNotFound(err) != nil {
		return fmt.Errorf("delete pod %s: %w", name, err)
	}
	return nil
}

// trim keeps the first n of s.
func trim(s []string, n int) []string {
	if len(s) > n {
		return append(s[:n:n], "...")
	}
	return s
}
