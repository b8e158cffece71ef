package bench

import (
	"context"
	"fmt"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/latchcsi/latch/internal/localcluster"
)

// move is one volume of the recovery burst: from a failed node to a
// healthy one, by a replacement Pod created at created.
type move struct {
	i        int
	from, to placement
	created  time.Time
}

// recoveryBurst is issue 23 step 3: 10% of the nodes (the fail set of
// which, see scaleWorld.failSet) go NotReady, their kubelet dead (their
// stand-in stops), get the out-of-service taint (NoExecute), their Pods
// are force-deleted (grace 0) and a replacement Pod for each volume is
// created on a healthy node. Per volume: the replacement's creation to its
// VolumeAttachment on the new node attached and the volume in that node's
// status. Checks: every moved volume attached on its new node, its old
// VolumeAttachment gone, and no volume ever had two attached
// VolumeAttachments at once (the watcher follows them throughout).
func (e *scaleEnv) recoveryBurst(ctx context.Context, p *scaleProc, which, prefix string, aw *attachWatcher) error {
	w := e.w
	if w.failK == 0 {
		e.rep.Notes = append(e.rep.Notes, fmt.Sprintf("%s: no recovery burst: %d nodes leave no 10%% to fail", which, w.nodes))
		return nil
	}
	lo, hi := w.failSet(which)
	var moves []*move
	for i := range w.volumes {
		if n := i % w.nodes; n >= lo && n < hi {
			moves = append(moves, &move{i: i,
				from: placement{pv: w.pv(i), node: w.node(i)},
				to:   placement{pv: w.pv(i), node: w.nodeName(i % w.healthyNodes())}})
		}
	}
	pvs := map[string]bool{}
	for _, m := range moves {
		pvs[m.from.pv] = true
	}
	// Their kubelets die: nothing reports for them any more (both fail
	// sets share the stand-in; the other set's Pods change only in its own
	// burst).
	w.stopFailingKubelet()
	writesBefore, err := apiWrites(ctx, e.admin)
	if err != nil {
		return err
	}
	u0 := p.usage()
	began := time.Now()
	if err := parallel(ctx, hi-lo, w.creators, func(ctx context.Context, k int) error {
		name := w.nodeName(lo + k)
		if err := w.kubelet.SetReady(ctx, name, false); err != nil {
			return err
		}
		return retry.RetryOnConflict(retry.DefaultRetry, func() error {
			return w.kubelet.Taint(ctx, name, v1.Taint{Key: localcluster.OutOfServiceTaint, Value: "nodeshutdown", Effect: v1.TaintEffectNoExecute})
		})
	}); err != nil {
		return fmt.Errorf("fail nodes %s..%s: %w", w.nodeName(lo), w.nodeName(hi-1), err)
	}
	zero := int64(0)
	if err := parallel(ctx, len(moves), w.creators, func(ctx context.Context, k int) error {
		name := w.pod(moves[k].i)
		err := e.client.CoreV1().Pods(w.ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		if ignoreNotFound(err) != nil {
			return fmt.Errorf("force-delete pod %s: %w", name, err)
		}
		return nil
	}); err != nil {
		return err
	}
	failed := time.Since(began)
	if err := parallel(ctx, len(moves), w.creators, func(ctx context.Context, k int) error {
		m := moves[k]
		m.created = time.Now()
		return w.createPodOn(ctx, fmt.Sprintf("%s-rpod%06d", w.prefix, m.i), w.pv(m.i), m.to.node)
	}); err != nil {
		return fmt.Errorf("replacement pods: %w", err)
	}
	vols := make([]awaited, len(moves))
	for k, m := range moves {
		vols[k] = awaited{at: m.to, since: m.created}
		// Its Pod is on the new node now, attached or not.
		w.moved[m.i] = m.to.node
	}
	_, lat, last := e.waitAttached(ctx, p, aw, "every moved volume attached on its new node", vols)
	oldGone := func() int {
		n := 0
		for _, m := range moves {
			if aw.vaGone(m.from) {
				n++
			}
		}
		return n
	}
	// Attached on the new node means detached from the old one already
	// (RWO), unless a controller attached twice; the old VA's last
	// removal may trail in the watch.
	_ = p.waitUntil(ctx, e.sz.ActionTimeout, "every moved volume's old VolumeAttachment gone", func(context.Context) bool { return oldGone() == len(moves) })
	// The API server's writes (every client's) from the first NotReady to
	// the last attach: how close the burst comes to what the API server
	// on this machine can take.
	if writesAfter, err := apiWrites(ctx, e.admin); err == nil && !last.IsZero() {
		n := writesAfter.Sub(writesBefore).Total()
		e.rep.Figures[prefix+"recovery_api_writes"] = n
		e.rep.Figures[prefix+"recovery_api_writes_by_kind"] = writesAfter.Sub(writesBefore)
		e.rep.Figures[prefix+"recovery_api_writes_per_s"] = round2(float64(n) / last.Sub(began).Seconds())
	}
	e.rep.Figures[prefix+"controller_recovery_cpu_s"] = round2(p.usage().CPUSeconds - u0.CPUSeconds)
	e.recoveryStages(prefix, began, moves, aw)
	p50, p99 := percentiles(lat)
	doubles := aw.doubleAttached(pvs)
	slices.Sort(doubles)
	e.rep.Figures[prefix+"recovery_volumes"] = len(moves)
	e.rep.Figures[prefix+"recovery_nodes"] = hi - lo
	e.rep.Figures[prefix+"recovery_fail_s"] = round2(failed.Seconds())
	e.rep.Figures[prefix+"recovery_p50_s"] = round2(p50 / 1000)
	e.rep.Figures[prefix+"recovery_p99_s"] = round2(p99 / 1000)
	if !last.IsZero() {
		e.rep.Figures[prefix+"recovery_all_attached_s"] = round2(last.Sub(began).Seconds())
	}
	e.rep.Figures[prefix+"recovery_double_attached"] = len(doubles)
	got := aw.attachedCount(vols)
	e.rep.check(which+": recovery burst: every moved volume attached on its new node and in its status",
		fmt.Sprint(len(moves)), fmt.Sprint(got), got == len(moves) && len(moves) > 0)
	gone := oldGone()
	e.rep.check(which+": recovery burst: every moved volume's VolumeAttachment on its failed node gone", fmt.Sprint(len(moves)), fmt.Sprint(gone), gone == len(moves))
	e.rep.check(which+": recovery burst: no volume attached to two nodes at once", "0",
		fmt.Sprintf("%d %v", len(doubles), trim(doubles, 5)), len(doubles) == 0)
	if all := aw.doubleAttached(nil); len(all) > 0 {
		e.rep.check(which+": no volume attached to two nodes at once (trickle and burst)", "0", fmt.Sprintf("%d %v", len(all), trim(all, 5)), false)
	}
	return nil
}

// recoveryStages splits the moved volumes' recovery into its steps, each a
// p50 and p99 over the volumes that reached it: the old VolumeAttachment
// gone (from the first node failed), the new one created (from when both
// its Pod existed and the old one was gone: the controller's reaction),
// attached (from its creation: the csi-attacher's), listed in the new
// node's status (from attached: the controller's status write).
func (e *scaleEnv) recoveryStages(prefix string, began time.Time, moves []*move, aw *attachWatcher) {
	var gone, create, attach, list []time.Duration
	for _, m := range moves {
		old, now := aw.timesAt(m.from), aw.timesAt(m.to)
		if !old.gone.IsZero() {
			gone = append(gone, old.gone.Sub(began))
		}
		ready := m.created
		if old.gone.After(ready) {
			ready = old.gone
		}
		if !now.created.IsZero() && !old.gone.IsZero() {
			create = append(create, max(0, now.created.Sub(ready)))
		}
		if !now.attached.IsZero() {
			attach = append(attach, now.attached.Sub(now.created))
		}
		if !now.listed.IsZero() && !now.attached.IsZero() {
			list = append(list, max(0, now.listed.Sub(now.attached)))
		}
	}
	p50s, p99s := map[string]float64{}, map[string]float64{}
	for _, st := range []struct {
		name string
		ds   []time.Duration
	}{{"old_va_gone_since_failure", gone}, {"va_created_after_pod_and_old_gone", create}, {"va_attached_after_created", attach}, {"listed_after_attached", list}} {
		p50, p99 := percentiles(st.ds)
		p50s[st.name], p99s[st.name] = round2(p50/1000), round2(p99/1000)
	}
	e.rep.Figures[prefix+"recovery_stages_p50_s"] = p50s
	e.rep.Figures[prefix+"recovery_stages_p99_s"] = p99s
}
