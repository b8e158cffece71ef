package reliability_test

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/latchcsi/latch/internal/attachdetach/controller"
	"github.com/latchcsi/latch/internal/attachdetach/decide"
	"github.com/latchcsi/latch/internal/kube/kubenames"
	"github.com/latchcsi/latch/internal/localcluster"
)

// The invariants, checked after every scenario:
//
//  1. Every VolumeAttachment that exists and is wanted ends attached or
//     carries an attachError; nothing that is not wanted stays.
//  2. Every deleted VolumeAttachment was unpublished in the driver and is
//     gone: no finalizer left behind, no PV held Terminating by us.
//  3. No single-node volume was ever published to two nodes at once (the
//     driver records every publication over the whole run, orphans
//     included: publications whose VolumeAttachment is gone).
//  4. One ControllerPublish per attachment; a repeat only where the
//     previous call's outcome was unknown to the controllers (the call
//     failed, or the test broke something in between).
//  5. Node status.volumesAttached matches the VolumeAttachments at rest.
//  6. No write of either controller was rejected by the API server as
//     invalid (400, 403, 413, 422): such a write fails the same way on
//     every retry, so what it should have shown (an attachError, a
//     status) would never be seen.
//  7. Every running Pod whose volume is not attached on its node at rest
//     says why: a FailedAttachVolume event of the attach/detach
//     controller on the Pod (the Multi-Attach error, a refused create, an
//     attach error), or an attachError on its VolumeAttachment there. A
//     wait nothing explains is a silent stall.
//  8. No successful ControllerUnpublish of a (volume handle, node ID) that
//     a VolumeAttachment claimed throughout the call (attached, not being
//     deleted, with our finalizer and that handle and node ID recorded):
//     an orphan, from memory or from the record, never takes a volume
//     from the VolumeAttachment that stands for it (claims_test.go).
//
// Volumes are judged by their volume handle (the unique volume), not by
// the PV that names them: two PVs may name one handle, and invariant 3
// holds across them.
//
// 1, 2, 5 and 7 are level conditions: checkInvariants waits for the world
// to come to rest, then reports every one that does not hold. 3, 4, 6 and
// 8 are judged on the history.

// pair is one volume (by volume handle) on one node.
type pair struct{ pv, node string }

// world is one read of everything the invariants look at.
type world struct {
	vas   []storagev1.VolumeAttachment
	nodes map[string]*v1.Node
	// wanted maps each PV to the nodes whose running Pods use it, for Pods
	// on Ready nodes that are not out of service.
	wanted map[string][]string
	// unsure nodes are NotReady or out of service: what is attached there
	// depends on timing the invariants do not judge.
	unsure map[string]bool
	pvs    []v1.PersistentVolume
	// handle maps each PV of the driver to its volume handle.
	handle map[string]string
	// published maps pair to true for every publication in the driver.
	published map[pair]bool
	// podVolumes are the volumes (by PV) of the running Pods counted in
	// wanted, one entry per Pod and PV.
	podVolumes []podVolume
	// toldWhy holds the UIDs of the Pods that carry a FailedAttachVolume
	// event of the attach/detach controller.
	toldWhy map[types.UID]bool
}

// podVolume is one PV a running Pod uses on its node.
type podVolume struct {
	pod, pv, node string
	uid           types.UID
}

func (e *env) vas() []storagev1.VolumeAttachment {
	list, err := e.client.StorageV1().VolumeAttachments().List(context.WithoutCancel(e.ctx), metav1.ListOptions{})
	if err != nil {
		return nil
	}
	var out []storagev1.VolumeAttachment
	for _, va := range list.Items {
		if va.Spec.Attacher == e.driver {
			out = append(out, va)
		}
	}
	return out
}

func (e *env) read() (*world, error) {
	w := &world{nodes: map[string]*v1.Node{}, wanted: map[string][]string{}, unsure: map[string]bool{}, published: map[pair]bool{}, handle: map[string]string{},
		toldWhy: map[types.UID]bool{}}
	w.vas = e.vas()
	for _, name := range e.nodes {
		n, err := e.client.CoreV1().Nodes().Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			continue // deleted
		}
		w.nodes[name] = n
		ready := false
		for _, c := range n.Status.Conditions {
			ready = ready || (c.Type == v1.NodeReady && c.Status == v1.ConditionTrue)
		}
		for _, t := range n.Spec.Taints {
			ready = ready && t.Key != localcluster.OutOfServiceTaint
		}
		if !ready {
			w.unsure[name] = true
		}
	}
	pods, err := e.client.CoreV1().Pods(e.ns).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	pvcs, err := e.client.CoreV1().PersistentVolumeClaims(e.ns).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	claimPV := map[string]string{}
	for _, c := range pvcs.Items {
		if c.Status.Phase == v1.ClaimBound {
			claimPV[c.Name] = c.Spec.VolumeName
		}
	}
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil || p.Spec.NodeName == "" || w.nodes[p.Spec.NodeName] == nil || w.unsure[p.Spec.NodeName] {
			continue
		}
		for _, vol := range p.Spec.Volumes {
			if vol.PersistentVolumeClaim == nil {
				continue
			}
			pv := claimPV[vol.PersistentVolumeClaim.ClaimName]
			if pv == "" {
				continue
			}
			w.podVolumes = append(w.podVolumes, podVolume{pod: p.Name, uid: p.UID, pv: pv, node: p.Spec.NodeName})
			if !slices.Contains(w.wanted[pv], p.Spec.NodeName) {
				w.wanted[pv] = append(w.wanted[pv], p.Spec.NodeName)
			}
		}
	}
	events, err := e.client.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{FieldSelector: fields.Set{
		"reason": decide.ReasonFailedAttachVolume, "source": controller.EventComponent, "involvedObject.kind": "Pod",
	}.AsSelector().String()})
	if err != nil {
		return nil, err
	}
	for _, ev := range events.Items {
		w.toldWhy[ev.InvolvedObject.UID] = true
	}
	pvs, err := e.client.CoreV1().PersistentVolumes().List(e.ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for _, pv := range pvs.Items {
		if pv.Spec.CSI != nil && pv.Spec.CSI.Driver == e.driver {
			w.pvs = append(w.pvs, pv)
			w.handle[pv.Name] = pv.Spec.CSI.VolumeHandle
		}
	}
	byID := map[string]string{}
	for _, n := range e.nodes {
		byID[e.nodeID(n)] = n
	}
	for _, v := range e.mock.State().Volumes {
		for _, p := range v.Published {
			w.published[pair{v.ID, byID[p.NodeID]}] = true
		}
	}
	return w, nil
}

// restProblems lists every level invariant (1, 2, 5, 7) that does not hold.
func (e *env) restProblems(w *world) []string {
	var out []string
	fail := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	finalizer := kubenames.AttacherFinalizer(e.driver)
	// handleOf is the volume handle of a PV; a PV that is gone keeps its
	// name (the harness names handles after their first PV).
	handleOf := func(pv string) string {
		if h, ok := w.handle[pv]; ok {
			return h
		}
		return pv
	}
	// wantedOn maps each volume handle to the nodes whose Pods use any PV
	// of it: a VolumeAttachment is named after the handle, and the
	// controller reuses one made through another PV of the handle.
	wantedOn := map[string][]string{}
	for pv, nodes := range w.wanted {
		h := handleOf(pv)
		for _, n := range nodes {
			if !slices.Contains(wantedOn[h], n) {
				wantedOn[h] = append(wantedOn[h], n)
			}
		}
	}
	hasVA := map[pair]bool{}
	// explained: the VolumeAttachment of the pair is attached, or says
	// why not (attachError).
	explained := map[pair]bool{}
	attached := map[string][]v1.UniqueVolumeName{}
	for _, va := range w.vas {
		pv := ptrStr(va.Spec.Source.PersistentVolumeName)
		node := va.Spec.NodeName
		hasVA[pair{handleOf(pv), node}] = true
		if va.DeletionTimestamp == nil && (va.Status.Attached || va.Status.AttachError != nil) {
			explained[pair{handleOf(pv), node}] = true
		}
		if w.unsure[node] {
			continue
		}
		// 2: nothing deleting stays (its detach finished, its finalizer
		// went).
		if va.DeletionTimestamp != nil {
			fail("invariant 2: VolumeAttachment %s (%s on %s) is still being deleted, finalizers %v, detachError %v", va.Name, pv, node, va.Finalizers, va.Status.DetachError)
			continue
		}
		// 1: wanted ones are attached or say why not; unwanted ones go.
		if w.nodes[node] != nil && !slices.Contains(wantedOn[handleOf(pv)], node) {
			fail("invariant 1: VolumeAttachment %s (%s on %s) exists but no running Pod on that node wants it", va.Name, pv, node)
			continue
		}
		if va.Status.Attached {
			attached[node] = append(attached[node], kubenames.UniqueVolumeName(e.driver, handleOf(pv)))
			if !slices.Contains(va.Finalizers, finalizer) {
				fail("invariant 2: attached VolumeAttachment %s has no %s finalizer: a delete would skip the unpublish", va.Name, finalizer)
			}
			if !w.published[pair{handleOf(pv), node}] {
				fail("invariant 2: VolumeAttachment %s says attached but the driver has %s not published to %s", va.Name, pv, node)
			}
		} else if va.Status.AttachError == nil || va.Status.AttachError.Message == "" {
			fail("invariant 1: VolumeAttachment %s (%s on %s) is neither attached nor carries an attachError", va.Name, pv, node)
		}
	}
	// 1: every wanted volume got a VolumeAttachment on one of its nodes
	// (a ReadWriteOnce volume wanted on two nodes gets one), whichever PV
	// of its handle that is.
	// An exclusive handle wanted through several PVs (a ReadWriteMany
	// alias of a ReadWriteOnce PV) goes to one node at a time.
	for h, nodes := range wantedOn {
		if !slices.ContainsFunc(nodes, func(n string) bool { return hasVA[pair{h, n}] }) {
			fail("invariant 1: volume handle %s is wanted on %v but has no VolumeAttachment there", h, nodes)
		}
	}
	// 7: a Pod whose volume is not attached on its node is told why.
	for _, pw := range w.podVolumes {
		if !explained[pair{handleOf(pw.pv), pw.node}] && !w.toldWhy[pw.uid] {
			fail("invariant 7: Pod %s wants %s on %s, where it is not attached, and neither a %s event on the Pod nor an attachError says why",
				pw.pod, pw.pv, pw.node, decide.ReasonFailedAttachVolume)
		}
	}
	// 2: the driver has nothing published that no VolumeAttachment asks for.
	for p := range w.published {
		if !hasVA[p] && !w.unsure[p.node] {
			fail("invariant 2: the driver still has %s published to %q but no VolumeAttachment exists for it", p.pv, p.node)
		}
	}
	// 2: no PV is held Terminating by our finalizer without a
	// VolumeAttachment that needs it.
	for _, pv := range w.pvs {
		if pv.DeletionTimestamp == nil || !slices.Contains(pv.Finalizers, finalizer) {
			continue
		}
		if !slices.ContainsFunc(w.vas, func(va storagev1.VolumeAttachment) bool {
			return ptrStr(va.Spec.Source.PersistentVolumeName) == pv.Name
		}) {
			fail("invariant 2: PV %s is Terminating, held only by the %s finalizer", pv.Name, finalizer)
		}
	}
	// 5: node status lists exactly the attached VolumeAttachments.
	for name, n := range w.nodes {
		if w.unsure[name] {
			continue
		}
		var got []v1.UniqueVolumeName
		for _, av := range n.Status.VolumesAttached {
			got = append(got, av.Name)
		}
		want := attached[name]
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			fail("invariant 5: node %s status.volumesAttached = %v, attached VolumeAttachments = %v", name, got, want)
		}
	}
	sort.Strings(out)
	return out
}

// checkInvariants waits up to settle for the level invariants to hold,
// reports those that never did, and judges the history invariants. It
// returns how many individual checks it made.
func (e *env) checkInvariants(settle time.Duration) int {
	e.t.Helper()
	var problems []string
	var checks int
	err := wait.PollUntilContextTimeout(e.ctx, 200*time.Millisecond, settle, true, func(context.Context) (bool, error) {
		w, err := e.read()
		if err != nil {
			problems = []string{"read the world: " + err.Error()}
			return false, nil
		}
		problems = e.restProblems(w)
		checks = len(w.vas) + len(w.wanted) + len(w.published) + len(w.pvs) + len(w.nodes)
		return len(problems) == 0, nil
	})
	if err != nil {
		e.dump()
		e.t.Errorf("the world did not come to rest within %s:\n  %s", settle, strings.Join(problems, "\n  "))
	}
	return checks + e.checkHistory()
}

// checkHistory judges invariants 3, 4, 6 and 8 on everything the driver and
// the API server saw.
func (e *env) checkHistory() int {
	e.t.Helper()
	if n, rejected := e.apiWrites.problems(10); n > 0 {
		e.t.Errorf("invariant 6: the API server rejected %d writes of the controllers as invalid; nothing a retry does changes that, so what they should have shown was lost:\n  %s",
			n, strings.Join(rejected, "\n  "))
	}
	if e.claims != nil {
		if bad := e.claims.claimedUnpublishes(e.mock.Calls(), e.disruptedBetween); len(bad) > 0 {
			e.t.Errorf("invariant 8: %d unpublishes of a publication that an attached VolumeAttachment with our finalizer claimed:\n  %s", len(bad), strings.Join(bad, "\n  "))
		}
	}
	stats := e.mock.Stats()
	if p := stats.Publish; p.SingleNodeViolationsTotal != 0 || p.MaxSingleNodePublishedNodes > 1 {
		e.t.Errorf("invariant 3: a single-node volume was published to two nodes at once: %d times (max %d nodes), e.g. %+v",
			p.SingleNodeViolationsTotal, p.MaxSingleNodePublishedNodes, p.SingleNodeViolations)
	}
	if stats.DroppedCalls > 0 {
		e.t.Errorf("the driver's call log dropped %d calls: invariant 4 cannot be judged", stats.DroppedCalls)
		return 1
	}
	calls := e.mock.Calls()
	// Judge calls in the order they completed: that is the order their
	// effects became visible.
	sort.SliceStable(calls, func(i, j int) bool { return calls[i].End.Before(calls[j].End) })
	type episode struct {
		published bool
		// unknown: a call for the pair failed since the last success, so
		// the controllers could not know the driver's state.
		unknown  bool
		lastCall time.Time
	}
	eps := map[pair]*episode{}
	e.repeats = map[string]int{}
	checks := 1
	for _, c := range calls {
		if !c.Done() || (c.Method != "ControllerPublishVolume" && c.Method != "ControllerUnpublishVolume") {
			continue
		}
		checks++
		k := pair{c.VolumeID, c.NodeID}
		ep := eps[k]
		if ep == nil {
			ep = &episode{}
			eps[k] = ep
		}
		ok := c.Code == codes.OK
		switch {
		case c.Method == "ControllerUnpublishVolume" && ok:
			*ep = episode{}
		case !ok:
			ep.unknown = true
		case ep.published && !ep.unknown:
			// Judged in completion order, a call that ended late may
			// have started first (a killed csi-attacher's slow call):
			// the window between the two starts is what could hide an
			// outcome, whichever began first.
			from, to := ep.lastCall, c.Start
			if to.Before(from) {
				from, to = to, from
			}
			if what := e.disruptedBetween(from, to); what != "" {
				e.repeats[what]++
				break
			}
			e.t.Errorf("invariant 4: ControllerPublishVolume of %s to %s at %s repeated a successful publish of %s with nothing in between that could have hidden its outcome (disruptions at %v)",
				c.VolumeID, c.NodeID, c.Start.Format(time.StampMicro), ep.lastCall.Format(time.StampMicro), e.disruptionTimes())
		}
		if ok && c.Method == "ControllerPublishVolume" {
			ep.published, ep.unknown = true, false
		}
		ep.lastCall = c.Start
	}
	return checks
}

// teardownClean deletes every Pod, waits until every VolumeAttachment is
// gone and checks that the driver has nothing published any more: every
// detach went through the driver.
func (e *env) teardownClean() {
	e.t.Helper()
	pods, err := e.client.CoreV1().Pods(e.ns).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	for _, p := range pods.Items {
		e.deletePod(p.Name)
	}
	e.eventually(2*time.Minute, "every VolumeAttachment gone after deleting every Pod", func() bool { return len(e.vas()) == 0 })
	for _, v := range e.mock.State().Volumes {
		if len(v.Published) > 0 {
			e.t.Errorf("invariant 2: every VolumeAttachment is gone but the driver still has %s published to %+v", v.ID, v.Published)
		}
	}
	e.checkHistory()
}

func (e *env) disruptionTimes() []string {
	e.disruptMu.Lock()
	defer e.disruptMu.Unlock()
	var out []string
	for _, d := range e.disruptions {
		out = append(out, d.what+" "+d.start.Format(time.StampMicro)+"–"+d.end.Format(time.StampMicro))
	}
	return out
}
