package reliability_test

import (
	"time"

	"google.golang.org/grpc/codes"

	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/stack"
	"github.com/latchcsi/latch/internal/testsupport/kubeletorder"
)

// The real-kubelet chaos run's kubelet kills (chaos_kubelet_test.go).

// killKubelet SIGKILLs the kubelet of a node (one at a time) and
// schedules its restart after a short pause: the new kubelet
// reconstructs its volumes from its root directory. Only a quiet node's
// kubelet is killed (see busy).
func (c *kchaos) killKubelet() {
	if len(c.down) > 0 {
		c.skipped["kill kubelet: one is already down"]++
		return
	}
	n := c.w.nodes[c.rng.IntN(len(c.w.nodes))]
	if why := c.busy(n); why != "" {
		c.skipped["kill kubelet: "+why]++
		return
	}
	if mounted := len(c.w.mock.NodeVolumes(stack.NodeID(n)).Published); mounted > 0 {
		c.done["kubelet killed with volumes mounted"]++
	}
	if err := c.w.hollow[n].KillKubelet(); err != nil {
		c.w.t.Fatal(err)
	}
	c.down[n] = time.Now().Add(time.Duration(500+c.rng.IntN(2500)) * time.Millisecond)
	c.done["kubelet killed and restarted"]++
	c.w.t.Logf("%s kubelet of %s killed, restarts at %s", kubeletorder.Stamp(time.Now()), n, kubeletorder.Stamp(c.down[n]))
}

// busy says why node n's kubelet is not quiet ("" when it is). The real
// kubelet rebuilds its volumes after a restart from the Pods' volume
// directories, which exist only while a volume is published: a volume
// staged but not (or no longer) published on the node when the kubelet
// dies is forgotten and never NodeUnstaged; so is a Node call that
// failed with a code the kubelet takes for an uncertain mount (the
// transient codes the run injects: Unavailable, DeadlineExceeded,
// ResourceExhausted, Aborted) until the kubelet cleans it up, even after
// its Pod is gone. That is the kubelet's limit, not latch's (the
// controller detaches once the Pod is deleted and the volume is in no
// volumesInUse), so the run kills a kubelet only when every Pod of the
// run on its node is mounted and not deleted, every volume staged there
// is published, no volume's last Node call there failed, and no Node
// call is in flight there. Pods come and go
// only from the run's own goroutine, so no new mount or unmount starts
// before the kill.
func (c *kchaos) busy(n string) string {
	id := stack.NodeID(n)
	last := map[string]csimock.Call{}
	for _, call := range c.w.mock.NodeCalls(id) {
		if !call.Done() {
			return "a Node call in flight"
		}
		if kubeletorder.IsNodeMethod(call.Method) {
			last[call.VolumeID] = call
		}
	}
	for _, call := range last {
		if call.Code != codes.OK {
			return "a volume's last Node call failed (an uncertain mount)"
		}
	}
	nv := c.w.mock.NodeVolumes(id)
	for vol := range nv.Staged {
		if len(nv.Published[vol]) == 0 {
			return "a volume staged, not published"
		}
	}
	for _, v := range c.vols {
		p := v.pod
		if p == nil || p.node != n {
			continue
		}
		if !p.deleted.IsZero() {
			return "a Pod being torn down"
		}
		if len(nv.Published[p.pv]) == 0 {
			return "a Pod not mounted yet"
		}
	}
	return ""
}

func (c *kchaos) restartKubelet(n string) {
	if err := c.w.hollow[n].StartKubelet(c.w.ctx); err != nil {
		c.w.t.Fatal(err)
	}
	delete(c.down, n)
	c.w.t.Logf("%s kubelet of %s started again", kubeletorder.Stamp(time.Now()), n)
}
