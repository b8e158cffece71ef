package attachdetach_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/latchcsi/latch/internal/attachdetach/controller"
	"github.com/latchcsi/latch/internal/csimock"
)

// Start and failover: the controller that starts (a restart, or a replica
// that just won the Lease) must fill its desired state from every existing
// Pod before it decides any volume. These tests build a node with volumes
// in every state an attachment can be in when the controller goes away,
// restart the controller (or fail over between two leader-elected
// replicas) several times, and check from the API server's write log, the
// mock driver's call log and a watch on the Node that nothing a Pod still
// wants was detached, re-created, re-published or dropped from the node
// status, and that what no Pod wants any more was detached.
//
// The race this guards against is between the queue that records Pods and
// the queue that decides volumes. It is made likely on a broken controller
// by many Pods that sort before the ones using volumes (the Pod queue is
// FIFO, filled in the informer's list order), so the volumes' keys are
// decided while the Pod queue is still busy with them.

// fillerPods is how many Pods without attachable volumes sort before the
// ones with attachable volumes.
const fillerPods = 150

// restartCycles is how many times each test restarts or fails over.
const restartCycles = 5

func TestControllerRestart_everyAttachmentState_nothingWantedDetachedOrRecreated(t *testing.T) {
	w := newStartStates(t)
	var srv *servedController
	start := func() { srv = w.serve("single", false) }
	start()
	w.build()
	for i := range restartCycles {
		w.cycle(i, func() { srv.stop() }, start)
	}
	w.finish()
	srv.stop()
}

func TestLeaderFailover_everyAttachmentState_nothingWantedDetachedOrRecreated(t *testing.T) {
	w := newStartStates(t)
	leader := w.serve("replica-0", true)
	w.waitLeader(leader)
	standby := w.serve("replica-1", true)
	w.build()
	next := 2
	for i := range restartCycles {
		w.cycle(i, func() {
			// The standby is held off the Lease while the test sets up
			// what happens during the failover; the leader dies the
			// way a killed process does (network first, nothing
			// released).
			standby.api.Partition()
			leader.kill()
		}, func() {
			standby.api.Heal()
			w.waitLeader(standby)
			leader = standby
			standby = w.serve(fmt.Sprintf("replica-%d", next), true)
			next++
		})
	}
	w.finish()
	standby.stop()
	leader.stop()
}

// startStates is one node with volumes in every attachment state, and the
// logs the checks read.
type startStates struct {
	e    *env
	drv  *csimock.Driver
	node string
	log  apiLog

	// wanted lists the PVs some Pod wants.
	wanted map[string]bool
	// pending's publish hangs forever; errored's publish fails;
	// detaching's unpublish hangs forever (its Pod is gone).
	pending, errored, detaching string
	// hangs are the fault rules removed before the final teardown.
	hangs []string
}

func newStartStates(t *testing.T) *startStates {
	e := newEnvWith(t, envOptions{mockDriver: true, noController: true})
	return &startStates{e: e, drv: e.stack.Driver, wanted: map[string]bool{}}
}

func (w *startStates) ctrlConfig() controller.Config {
	return controller.Config{Workers: 4, RetryIntervalStart: 100 * time.Millisecond, RetryIntervalMax: time.Second}
}

// pod creates a Pod using pv. Pods with volumes sort after the fillers.
func (w *startStates) pod(name, pv string) {
	w.e.t.Helper()
	w.e.pod("z-"+name, w.node, pv)
	w.wanted[pv] = true
}

func (w *startStates) deletePod(name, pv string) {
	w.e.t.Helper()
	err := w.e.client.CoreV1().Pods(w.e.ns).Delete(w.e.ctx, "z-"+name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	if err != nil {
		w.e.t.Fatalf("delete pod z-%s: %v", name, err)
	}
	delete(w.wanted, pv)
}

func (w *startStates) fault(r csimock.Rule) string {
	w.e.t.Helper()
	id, err := w.drv.AddFault(r)
	if err != nil {
		w.e.t.Fatal(err)
	}
	return id
}

// build makes the states that last for the whole test: fillers, an
// attached and mounted volume, an attached volume the Pod has not mounted
// yet, a VolumeAttachment whose publish hangs, one whose publish fails,
// and one that is being detached.
func (w *startStates) build() {
	e := w.e
	w.node = e.addNode("n1")
	w.fillers()

	mounted := e.volume("mounted", rwo())
	w.pod("mounted", mounted)
	e.waitAttachedVA(mounted, w.node)
	e.waitPodRunning("z-mounted")
	e.eventually("mounted volume in use", func() (bool, error) {
		return slices.Contains(e.node(w.node).Status.VolumesInUse, e.unique(mounted)), nil
	})
	// From here on nothing changes volumesInUse: every later volume is
	// attached but not mounted, as while a kubelet is about to mount it.
	e.stopKubelet()

	notMounted := e.volume("notmounted", rwo())
	w.pod("notmounted", notMounted)
	e.waitAttachedVA(notMounted, w.node)

	w.pending = e.volume("pending", rwo())
	w.hangs = append(w.hangs, w.fault(csimock.Rule{Method: "ControllerPublishVolume", VolumeID: w.pending, Hang: true}))
	w.pod("pending", w.pending)

	w.errored = e.volume("errored", rwo())
	w.hangs = append(w.hangs, w.fault(csimock.Rule{Method: "ControllerPublishVolume", VolumeID: w.errored, Code: codes.InvalidArgument, Message: "refused by the test"}))
	w.pod("errored", w.errored)

	w.detaching = e.volume("detaching", rwo())
	w.pod("detaching", w.detaching)
	e.waitAttachedVA(w.detaching, w.node)
	w.hangs = append(w.hangs, w.fault(csimock.Rule{Method: "ControllerUnpublishVolume", VolumeID: w.detaching, Hang: true}))
	w.deletePod("detaching", w.detaching)

	e.eventually("the pending, errored and detaching states", func() (bool, error) {
		p, ok1 := e.getVA(e.vaName(w.pending, w.node))
		r, ok2 := e.getVA(e.vaName(w.errored, w.node))
		d, ok3 := e.getVA(e.vaName(w.detaching, w.node))
		return ok1 && len(p.Finalizers) > 0 && !p.Status.Attached &&
			ok2 && r.Status.AttachError != nil &&
			ok3 && d.DeletionTimestamp != nil, nil
	})
	e.waitNodeAttached(w.node, sortedNames(e.unique(mounted), e.unique(notMounted))...)
}

// fillers creates Pods that use no attachable volume and sort before the
// others, on the same node.
func (w *startStates) fillers() {
	e := w.e
	var wg sync.WaitGroup
	errs := make(chan error, fillerPods)
	for i := range fillerPods {
		wg.Go(func() {
			pod := localPod(e.ns, fmt.Sprintf("a-filler-%03d", i), w.node)
			if _, err := e.client.CoreV1().Pods(e.ns).Create(e.ctx, pod, metav1.CreateOptions{}); err != nil {
				errs <- err
			}
		})
		if i%16 == 15 {
			wg.Wait()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		e.t.Fatalf("create filler pod: %v", err)
	}
}

func localPod(ns, name, node string) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1.PodSpec{
			NodeName:   node,
			Containers: []v1.Container{{Name: "app", Image: "registry.invalid/app:latest"}},
			Volumes:    []v1.Volume{{Name: "scratch", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}},
		},
	}
}

// cycle takes the controller down, changes the cluster while it is down,
// brings it up and checks what the new controller did. Each cycle adds a
// volume whose publish is still in flight at start (attaching), one that
// got attached while the controller was down (so the node status does
// not list it yet), one whose Pod was deleted while the controller was
// down, and one whose Pod was created while it was down.
func (w *startStates) cycle(i int, down, up func()) {
	e := w.e
	t := e.t
	attaching := e.volume(fmt.Sprintf("attaching%d", i), rwo())
	lateStatus := e.volume(fmt.Sprintf("latestatus%d", i), rwo())
	gone := e.volume(fmt.Sprintf("gone%d", i), rwo())
	created := e.volume(fmt.Sprintf("created%d", i), rwo())

	w.pod(fmt.Sprintf("gone%d", i), gone)
	e.waitAttachedVA(gone, w.node)
	e.eventually("gone volume in node status", func() (bool, error) {
		return slices.Contains(attachedNames(e.node(w.node)), e.unique(gone)), nil
	})
	slowAttach := w.fault(csimock.Rule{Method: "ControllerPublishVolume", VolumeID: attaching, Latency: 3 * time.Second})
	slowStatus := w.fault(csimock.Rule{Method: "ControllerPublishVolume", VolumeID: lateStatus, Latency: time.Second})
	w.pod(fmt.Sprintf("attaching%d", i), attaching)
	w.pod(fmt.Sprintf("latestatus%d", i), lateStatus)
	e.eventually("publishes of the attaching and late-status volumes in flight", func() (bool, error) {
		return w.publishStarted(attaching) && w.publishStarted(lateStatus), nil
	})

	down()
	e.waitAttachedVA(lateStatus, w.node)
	w.deletePod(fmt.Sprintf("gone%d", i), gone)
	w.pod(fmt.Sprintf("created%d", i), created)

	// What the new controller must keep.
	before := map[string]*storagev1.VolumeAttachment{}
	for pv := range w.wanted {
		if va, ok := e.getVA(e.vaName(pv, w.node)); ok {
			before[pv] = va
		}
	}
	node := e.node(w.node)
	var listed []v1.UniqueVolumeName
	for _, name := range attachedNames(node) {
		for pv := range w.wanted {
			if e.unique(pv) == name {
				listed = append(listed, name)
			}
		}
	}
	lastCall := w.lastCallID()
	fromWrite := time.Now()
	nodeWatch := w.watchNode(node.ResourceVersion)
	started := time.Now()

	up()

	e.waitVAGone(gone, w.node)
	e.waitAttachedVA(created, w.node)
	e.waitAttachedVA(attaching, w.node)
	e.eventually("node status lists every attached volume a Pod wants", func() (bool, error) {
		got := attachedNames(e.node(w.node))
		for _, pv := range []string{created, attaching, lateStatus} {
			if !slices.Contains(got, e.unique(pv)) {
				return false, nil
			}
		}
		return !slices.Contains(got, e.unique(gone)), nil
	})
	updates := nodeWatch()
	t.Logf("cycle %d: settled %v after the restart", i, time.Since(started).Round(time.Millisecond))
	w.drv.RemoveFault(slowAttach)
	w.drv.RemoveFault(slowStatus)

	// No VolumeAttachment a Pod wants was deleted or replaced.
	for pv, va := range before {
		now, ok := e.getVA(va.Name)
		switch {
		case !ok:
			t.Errorf("cycle %d: VolumeAttachment %s of wanted volume %s was deleted", i, va.Name, pv)
		case now.UID != va.UID:
			t.Errorf("cycle %d: VolumeAttachment %s of wanted volume %s was re-created (uid %s, was %s)", i, va.Name, pv, now.UID, va.UID)
		case now.DeletionTimestamp != nil && va.DeletionTimestamp == nil:
			t.Errorf("cycle %d: VolumeAttachment %s of wanted volume %s is being deleted", i, va.Name, pv)
		}
	}
	// The API writes of the new controller: one create (the Pod created
	// while it was down), one delete (the Pod deleted while it was down).
	var creates, deletes []string
	for _, wr := range w.log.since(fromWrite) {
		if !strings.Contains(wr.Path, "/volumeattachments") {
			continue
		}
		switch wr.Method {
		case http.MethodPost:
			creates = append(creates, fmt.Sprintf("%s (%d)", wr.Path, wr.Code))
		case http.MethodDelete:
			deletes = append(deletes, wr.Path)
		}
	}
	if len(creates) != 1 {
		t.Errorf("cycle %d: VolumeAttachment creates after the restart = %q, want one (for the Pod created while down)", i, creates)
	}
	wantDelete := "/apis/storage.k8s.io/v1/volumeattachments/" + e.vaName(gone, w.node)
	if !slices.Equal(deletes, []string{wantDelete}) {
		t.Errorf("cycle %d: VolumeAttachment deletes after the restart = %q, want only %q (the Pod deleted while down)", i, deletes, wantDelete)
	}
	// No driver call undid or repeated an attachment a Pod wants.
	unpublished := false
	for _, c := range w.callsAfter(lastCall) {
		switch c.Method {
		case "ControllerUnpublishVolume":
			if c.VolumeID == gone {
				unpublished = true
			} else if w.wanted[c.VolumeID] {
				t.Errorf("cycle %d: ControllerUnpublishVolume of wanted volume %s after the restart", i, c.VolumeID)
			}
		case "ControllerPublishVolume":
			if va, ok := before[c.VolumeID]; ok && va.Status.Attached {
				t.Errorf("cycle %d: ControllerPublishVolume of volume %s, attached before the restart", i, c.VolumeID)
			}
		}
	}
	if !unpublished {
		t.Errorf("cycle %d: volume %s, whose Pod was deleted while the controller was down, was never unpublished", i, gone)
	}
	// The node status never lost a volume a Pod wants.
	for _, n := range updates {
		got := attachedNames(n)
		for _, name := range listed {
			if !slices.Contains(got, name) {
				t.Errorf("cycle %d: node %s status.volumesAttached dropped wanted volume %s (resourceVersion %s: %v)", i, w.node, name, n.ResourceVersion, got)
			}
		}
	}
}

func (w *startStates) publishStarted(pv string) bool {
	for _, c := range w.drv.CallsTo("ControllerPublishVolume") {
		if c.VolumeID == pv {
			return true
		}
	}
	return false
}

func (w *startStates) lastCallID() uint64 {
	var id uint64
	for _, c := range w.drv.Calls() {
		id = max(id, c.ID)
	}
	return id
}

func (w *startStates) callsAfter(id uint64) []csimock.Call {
	var out []csimock.Call
	for _, c := range w.drv.Calls() {
		if c.ID > id {
			out = append(out, c)
		}
	}
	return out
}

// watchNode records every version of the node from resourceVersion on;
// the returned func stops the watch and returns them.
func (w *startStates) watchNode(resourceVersion string) func() []*v1.Node {
	e := w.e
	ctx, cancel := context.WithCancel(e.ctx)
	wi, err := e.client.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", w.node).String(),
		ResourceVersion: resourceVersion,
	})
	if err != nil {
		cancel()
		e.t.Fatalf("watch node %s: %v", w.node, err)
	}
	var mu sync.Mutex
	var seen []*v1.Node
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range wi.ResultChan() {
			if n, ok := ev.Object.(*v1.Node); ok && ev.Type == watch.Modified {
				mu.Lock()
				seen = append(seen, n)
				mu.Unlock()
			}
		}
	}()
	return func() []*v1.Node {
		// Let the watch deliver what the last poll saw.
		time.Sleep(200 * time.Millisecond)
		wi.Stop()
		cancel()
		<-done
		mu.Lock()
		defer mu.Unlock()
		return seen
	}
}

// finish lets the hanging operations complete, deletes every Pod and
// waits until every VolumeAttachment of the test is gone, with the
// controller still running.
func (w *startStates) finish() {
	e := w.e
	for _, id := range w.hangs {
		w.drv.RemoveFault(id)
	}
	pods, err := e.client.CoreV1().Pods(e.ns).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	for _, p := range pods.Items {
		_ = e.client.CoreV1().Pods(e.ns).Delete(e.ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	}
	// The kubelet stand-in is stopped: unmount for it.
	patch := []byte(`{"status":{"volumesInUse":[]}}`)
	if _, err := e.client.CoreV1().Nodes().Patch(e.ctx, w.node, types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		e.t.Fatal(err)
	}
	defer func(wait time.Duration) { e.wait = wait }(e.wait)
	e.wait = time.Minute
	e.eventually("no VolumeAttachment left after every Pod was deleted", func() (bool, error) {
		vas, err := e.client.StorageV1().VolumeAttachments().List(e.ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, va := range vas.Items {
			if va.Spec.Attacher == e.driver {
				return false, nil
			}
		}
		return true, nil
	})
}
