package reliability_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/attachdetach/controller"
	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/stack"
	"github.com/latchcsi/latch/internal/testsupport/kubeletorder"
)

// The real-kubelet chaos run's sizes (chaosSize, as the stand-in chaos):
// the short run is part of the normal test suite, LATCH_SOAK=1 (make soak)
// runs the long one.
var (
	kchaosShort = chaosSize{volumes: 8, nodes: 3, duration: 45 * time.Second, tick: 300 * time.Millisecond}
	kchaosSoak  = chaosSize{volumes: 20, nodes: 3, duration: 5 * time.Minute, tick: 250 * time.Millisecond}
)

// kvol is one ReadWriteOnce volume of the run's pool.
type kvol struct {
	pv string
	// visited are the nodes a Pod of the volume was created on: a volume
	// goes to each node at most once (see checkDetaches).
	visited map[string]bool
	// pod is the volume's Pod until it is gone; moveTo, when set, is the
	// node its next Pod is created on once it is.
	pod    *kpod
	moveTo string
}

// kpod is one Pod the run created.
type kpod struct {
	name, pv, node string
	// deleted is when the run asked to delete it (zero: never).
	deleted time.Time
}

// kchaos is one real-kubelet run's bookkeeping.
type kchaos struct {
	w     *kubeletWorld
	rng   *rand.Rand
	vols  []*kvol
	pods  []*kpod
	nextV int
	// down maps a node whose kubelet was killed to when it restarts.
	down map[string]time.Time
	// done counts the actions taken, skipped the ones that could not
	// apply (and why), by kind.
	done, skipped map[string]int
	// doublePublish is set once the driver saw a single-node volume on
	// two nodes at once (reported once, at the step that saw it).
	doublePublish bool
}

// TestChaos_realKubelets_seededFaultsInvariantsHold is the chaos test on
// real kubelets: three hollow kubelets with the mock driver's node
// endpoints, the real csi-attacher in-process and the attach/detach
// controller. For a fixed time, seeded random actions (replay with
// LATCH_CHAOS_SEED) create Pods for free volumes, delete Pods, move
// volumes to another node, SIGKILL a kubelet and start it again after a
// short pause, restart the controller or csi-attacher, and inject driver
// faults (transient errors of ControllerPublish/Unpublish and of
// NodeStage/NodePublish; latency on each of them except ControllerPublish,
// see driverFault). Checked during the run and at its end:
// no ReadWriteOnce volume published to two nodes at once; no volume
// unmounted (NodeUnpublish) under a Pod the run had not deleted; every
// Pod created either ran or was deleted (none stuck); every attach of a
// Pod that ran passes kubeletorder's CheckAttach and every detach its
// CheckDetach; after every Pod is deleted and everything restarted, no
// VolumeAttachment, publication, staging or Node status entry is left;
// and the suite's history invariants 3, 4 and 6 (checkHistory).
//
// Two limits keep the checks exact. A volume reaches each node at most
// once (a volume that has been everywhere asked for is replaced by a
// fresh one), so one VolumeAttachment's life is all there is of a volume
// on a node, which CheckAttach and CheckDetach read. And a kubelet is
// killed only while its node is quiet (busy): the real kubelet forgets,
// across a restart, a volume staged but not published.
func TestChaos_realKubelets_seededFaultsInvariantsHold(t *testing.T) {
	size := pickChaosSize(kchaosShort, kchaosSoak)
	seed := chaosSeed(t, "real-kubelet chaos")
	start := time.Now()

	w := newKubeletWorld(t, controller.Config{}, size.nodes)
	c := &kchaos{w: w, rng: rand.New(rand.NewPCG(seed, seed^0x6b75)), down: map[string]time.Time{}, done: map[string]int{}, skipped: map[string]int{}}
	for range size.volumes {
		c.newVolume()
	}
	ready := time.Now()

	deadline := time.Now().Add(size.duration)
	for time.Now().Before(deadline) && w.ctx.Err() == nil && !t.Failed() {
		c.step()
		c.checkNoDoublePublish()
		time.Sleep(size.tick)
	}
	chaosEnd := time.Now()

	// Calm: no new faults, every kubelet up, every pending move made;
	// then every Pod the run did not delete must run.
	w.mock.ClearFaults()
	for n := range c.down {
		c.restartKubelet(n)
	}
	w.eventually(time.Minute, "every Pod deleted for a move gone and its successor created", func() bool {
		c.reap()
		return !slices.ContainsFunc(c.vols, func(v *kvol) bool { return v.moveTo != "" })
	})
	for _, p := range c.pods {
		if p.deleted.IsZero() {
			c.w.waitRunning(p.name)
		}
	}
	ran := c.checkAttaches()

	// Teardown: every Pod deleted (gracefully, through the kubelets).
	for _, p := range c.pods {
		if p.deleted.IsZero() {
			c.deletePod(p)
		}
	}
	w.eventually(90*time.Second, "every Pod gone", func() bool {
		c.reap()
		return !slices.ContainsFunc(c.vols, func(v *kvol) bool { return v.pod != nil })
	})
	w.checkNothingLeft(time.Minute)
	detaches := w.checkDetaches()
	c.checkNoUnmountUnderLivePod()
	c.checkNoDoublePublish()
	w.checkHistory()

	var done, skipped []string
	for k, n := range c.done {
		done = append(done, fmt.Sprintf("%s=%d", k, n))
	}
	for k, n := range c.skipped {
		skipped = append(skipped, fmt.Sprintf("%s=%d", k, n))
	}
	sort.Strings(done)
	sort.Strings(skipped)
	stats := w.mock.Stats()
	summary := fmt.Sprintf("real-kubelet chaos summary: seed=%d nodes=%d volumes=%d (in the pool at once %d) pods=%d ran=%d "+
		"publishes ok=%d of %d unpublishes ok=%d of %d detaches checked=%d actions [%s] skipped [%s] "+
		"setup=%s chaos phase=%s total=%s",
		seed, size.nodes, c.nextV, size.volumes, len(c.pods), ran,
		stats.Methods["ControllerPublishVolume"].ByCode["OK"], stats.Methods["ControllerPublishVolume"].Calls,
		stats.Methods["ControllerUnpublishVolume"].ByCode["OK"], stats.Methods["ControllerUnpublishVolume"].Calls,
		detaches, strings.Join(done, " "), strings.Join(skipped, " "),
		ready.Sub(start).Round(time.Second), chaosEnd.Sub(ready).Round(time.Second), time.Since(start).Round(time.Second))
	t.Log(summary)
	fmt.Fprintln(os.Stderr, summary)
	if detaches == 0 {
		t.Errorf("the run detached nothing: no detach was checked")
	}
}

// step takes one random action: mostly workload (Pods come and go,
// volumes move), sometimes a fault.
func (c *kchaos) step() {
	now := time.Now()
	for n, at := range c.down {
		if now.After(at) {
			c.restartKubelet(n)
		}
	}
	c.reap()
	switch r := c.rng.IntN(100); {
	case r < 28:
		c.createPod(c.w.nodes[c.rng.IntN(len(c.w.nodes))])
	case r < 42:
		c.deleteRandomPod()
	case r < 56:
		c.moveVolume()
	case r < 68:
		c.killKubelet()
	case r < 72:
		c.done["attach/detach controller restarted"]++
		c.w.killController()
	case r < 76:
		c.done["csi-attacher restarted"]++
		c.w.killAttacher()
	default:
		c.driverFault()
	}
}

// newVolume adds a fresh bound ReadWriteOnce PV+PVC (its own volume
// handle) to the pool.
func (c *kchaos) newVolume() *kvol {
	v := &kvol{pv: c.w.volume(fmt.Sprintf("k%d", c.nextV)), visited: map[string]bool{}}
	c.nextV++
	c.vols = append(c.vols, v)
	return v
}

// createPod creates a Pod on node for a free volume (no Pod) that has
// not been there. When every free volume has, one of them leaves the
// pool for a fresh one: a volume reaches a node at most once.
func (c *kchaos) createPod(node string) {
	var free, fresh []*kvol
	for _, v := range c.vols {
		if v.pod == nil {
			free = append(free, v)
			if !v.visited[node] {
				fresh = append(fresh, v)
			}
		}
	}
	if len(free) == 0 {
		c.skipped["create: no free volume"]++
		return
	}
	var v *kvol
	if len(fresh) > 0 {
		v = fresh[c.rng.IntN(len(fresh))]
	} else {
		old := free[c.rng.IntN(len(free))]
		c.vols = slices.DeleteFunc(c.vols, func(x *kvol) bool { return x == old })
		c.done["volume replaced (it had been on every node asked for)"]++
		v = c.newVolume()
	}
	c.startPod(v, node)
	c.done["create Pod"]++
}

func (c *kchaos) startPod(v *kvol, node string) {
	p := &kpod{name: fmt.Sprintf("p%d", len(c.pods)), pv: v.pv, node: node}
	if err := c.w.pod(p.name, node, v.pv); err != nil {
		c.w.t.Fatal(err)
	}
	c.pods = append(c.pods, p)
	v.pod, v.visited[node] = p, true
}

// deleteRandomPod deletes (gracefully) a Pod not yet deleted.
func (c *kchaos) deleteRandomPod() {
	live := c.livePods()
	if len(live) == 0 {
		c.skipped["delete: no Pod"]++
		return
	}
	c.deletePod(live[c.rng.IntN(len(live))].pod)
	c.done["delete Pod"]++
}

// moveVolume deletes the Pod of a volume that has a node left to go to;
// once the Pod is gone (reap), a Pod on that node is created for it.
func (c *kchaos) moveVolume() {
	type move struct {
		v  *kvol
		to []string
	}
	var moves []move
	for _, v := range c.livePods() {
		var to []string
		for _, n := range c.w.nodes {
			if !v.visited[n] {
				to = append(to, n)
			}
		}
		if len(to) > 0 {
			moves = append(moves, move{v, to})
		}
	}
	if len(moves) == 0 {
		c.skipped["move: no Pod whose volume has a node left to go to"]++
		return
	}
	m := moves[c.rng.IntN(len(moves))]
	m.v.moveTo = m.to[c.rng.IntN(len(m.to))]
	c.deletePod(m.v.pod)
	c.done["move volume"]++
}

// livePods are the volumes whose Pod the run has not deleted.
func (c *kchaos) livePods() []*kvol {
	var out []*kvol
	for _, v := range c.vols {
		if v.pod != nil && v.pod.deleted.IsZero() {
			out = append(out, v)
		}
	}
	return out
}

func (c *kchaos) deletePod(p *kpod) {
	p.deleted = time.Now()
	if err := c.w.client.CoreV1().Pods(c.w.ns).Delete(c.w.ctx, p.name, metav1.DeleteOptions{}); err != nil {
		c.w.t.Fatalf("delete Pod %s: %v", p.name, err)
	}
}

// reap frees the volumes whose deleted Pod is gone, creating the Pod of
// a pending move.
func (c *kchaos) reap() {
	for _, v := range c.vols {
		if v.pod == nil || v.pod.deleted.IsZero() {
			continue
		}
		gone, err := c.w.podGone(v.pod.name)
		if err != nil {
			c.w.t.Fatal(err)
		}
		if !gone {
			continue
		}
		v.pod = nil
		if to := v.moveTo; to != "" {
			v.moveTo = ""
			c.startPod(v, to)
		}
	}
}

// driverFault installs a short-lived driver fault: a transient error of
// ControllerPublish/Unpublish or of the kubelet's NodeStage/NodePublish,
// or latency on one of them except ControllerPublish. The suite's
// csi-attacher kill (killAttacher) cuts the replica's API connection and
// ends its context, but its reconciles in flight drain with a context
// that survives (internal/runner), so a slow ControllerPublish of the
// dead replica still ends OK in the driver, after the new replica may
// have unpublished it for a deleted VolumeAttachment: a publication no
// VolumeAttachment asks for, and a double publish once the volume moves.
// A real SIGKILL closes the gRPC connection and the mock driver ends the
// delay with the cancellation, publishing nothing; so the run puts no
// latency on ControllerPublish (a dead replica's late ControllerUnpublish
// is harmless: a volume never goes back to a node).
func (c *kchaos) driverFault() {
	methods := []string{"ControllerPublishVolume", "ControllerUnpublishVolume", "NodeStageVolume", "NodePublishVolume"}
	r := csimock.Rule{Method: methods[c.rng.IntN(len(methods))], Times: int64(1 + c.rng.IntN(3))}
	if c.rng.IntN(3) == 0 && r.Method != "ControllerPublishVolume" {
		r.Latency = time.Duration(200+c.rng.IntN(1300)) * time.Millisecond
		c.done["driver latency "+r.Method]++
	} else {
		r.Code, r.Message = transientCodes[c.rng.IntN(len(transientCodes))], "chaos"
		c.done["driver error "+r.Method]++
	}
	if _, err := c.w.mock.AddFault(r); err != nil {
		c.w.t.Fatal(err)
	}
}

// checkNoDoublePublish fails the test, once, when the driver saw a
// single-node volume published to two nodes at once.
func (c *kchaos) checkNoDoublePublish() {
	if c.doublePublish {
		return
	}
	if p := c.w.mock.Stats().Publish; p.SingleNodeViolationsTotal != 0 || p.MaxSingleNodePublishedNodes > 1 {
		c.doublePublish = true
		c.w.t.Errorf("a ReadWriteOnce volume was published to two nodes at once: %d times (max %d nodes), e.g. %+v",
			p.SingleNodeViolationsTotal, p.MaxSingleNodePublishedNodes, p.SingleNodeViolations)
		for _, v := range p.SingleNodeViolations {
			c.w.t.Logf("the driver's calls of %s:\n%s", v.VolumeID, kubeletorder.CallTable(slices.DeleteFunc(c.w.mock.Calls(), func(call csimock.Call) bool { return call.VolumeID != v.VolumeID })))
		}
	}
}

// checkAttaches checks the attach of every Pod that ran with
// kubeletorder's CheckAttach (ControllerPublish → NodeStage →
// NodePublish, Running only after the VolumeAttachment was attached) and
// returns how many ran.
func (c *kchaos) checkAttaches() int {
	c.w.t.Helper()
	ran := 0
	for _, p := range c.pods {
		if _, ok := c.w.hist.First(kubeletorder.PodNamed(p.name, func(p *v1.Pod) bool { return p.Status.Phase == v1.PodRunning })); !ok {
			continue
		}
		ran++
		c.w.order.CheckAttach(c.w.t, p.pv, p.node, stack.NodeID(p.node), p.name)
	}
	return ran
}

// checkNoUnmountUnderLivePod fails for each NodeUnpublish of a volume on
// a node that started before the run deleted the Pod it had there (a
// volume reaches a node once, so one Pod is all it had): a kubelet
// restart's reconstruction, or anything else, unmounted a running Pod's
// volume.
func (c *kchaos) checkNoUnmountUnderLivePod() {
	byPair := map[[2]string]*kpod{}
	for _, p := range c.pods {
		byPair[[2]string{p.pv, stack.NodeID(p.node)}] = p
	}
	for _, call := range c.w.mock.CallsTo("NodeUnpublishVolume") {
		p := byPair[[2]string{call.VolumeID, call.Endpoint}]
		if p == nil {
			c.w.t.Errorf("NodeUnpublish #%d of %s on %s, where no Pod of the run had it", call.ID, call.VolumeID, call.Endpoint)
			continue
		}
		if call.Code == codes.OK && (p.deleted.IsZero() || call.Start.Before(p.deleted)) {
			c.w.t.Errorf("NodeUnpublish #%d of %s on %s at %s, before the run deleted Pod %s (%s)", call.ID, call.VolumeID, call.Endpoint,
				kubeletorder.Stamp(call.Start), p.name, kubeletorder.Stamp(p.deleted))
		}
	}
}
