package reliability_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"

	"github.com/latchcsi/latch/internal/attachdetach/controller"
	"github.com/latchcsi/latch/internal/attacher"
	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/kube"
	"github.com/latchcsi/latch/internal/kube/kubenames"
	"github.com/latchcsi/latch/internal/localcluster"
)

// leader returns the holder of the csi-attacher Lease, "" when none.
func (e *env) leader() string {
	l, err := e.client.CoordinationV1().Leases(e.ns).Get(e.ctx, kube.LeaseName(e.driver), metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

func TestLeaderPartitionedFromAPIServer_standbyTakesOverWithoutDoublePublish(t *testing.T) {
	e := newEnv(t, options{replicas: 2})
	n1, n2 := e.addNode("n1"), e.addNode("n2")
	var first *replica
	e.eventually(30*time.Second, "a csi-attacher leader", func() bool {
		for _, r := range e.attachers {
			if e.leader() == r.identity {
				first = r
			}
		}
		return first != nil
	})
	const n = 10
	pvs := e.volumes(n)
	// Half attached on n1 before the partition.
	for i := range n / 2 {
		e.pod(fmt.Sprintf("p%d", i), n1, pvs[i])
	}
	for i := range n / 2 {
		e.waitAttached(pvs[i], n1)
	}
	// Slow publishes so the partition cuts some in the middle; then the
	// second half is asked for and the first half moves to n2 while the
	// leader cannot reach the API server.
	e.fault(csimock.Rule{Method: "ControllerPublishVolume", Latency: 400 * time.Millisecond})
	for i := n / 2; i < n; i++ {
		e.pod(fmt.Sprintf("p%d", i), n1, pvs[i])
	}
	e.eventually(30*time.Second, "a publish in flight", func() bool { return len(e.mock.CallsTo("ControllerPublishVolume")) > n/2 })
	endPartition := e.disrupt("csi-attacher leader partitioned")
	first.api.Partition()
	for i := range n / 2 {
		e.deletePod(fmt.Sprintf("p%d", i))
		e.pod(fmt.Sprintf("q%d", i), n2, pvs[i])
	}
	e.eventually(30*time.Second, "the standby taking the Lease", func() bool { l := e.leader(); return l != "" && l != first.identity })
	for i := n / 2; i < n; i++ {
		e.waitAttached(pvs[i], n1)
	}
	for i := range n / 2 {
		e.waitGone(pvs[i], n1)
		e.waitAttached(pvs[i], n2)
	}
	// The partitioned leader notices it cannot renew, stops and exits (and
	// is restarted as a candidate).
	e.eventually(time.Minute, "the partitioned leader giving up", func() bool { return first.restarts() > 0 })
	// Heal the partition: the old leader comes back as a standby and
	// changes nothing.
	first.api.Heal()
	endPartition()
	time.Sleep(3 * time.Second)
	if l := e.leader(); l == first.identity {
		t.Errorf("the healed replica took the Lease back from a healthy leader")
	}
	e.checkInvariants(30 * time.Second)
	e.teardownClean()
}

// writer edits the labels and annotations of the test's VolumeAttachments
// the way another controller or an admin would, with both merge patches and
// read-modify-write updates, and remembers what it wrote.
type writer struct {
	e       *env
	pause   time.Duration // between rounds over all VolumeAttachments
	mu      sync.Mutex
	written map[string]map[string]string // VA name → annotation → value
	writes  int
}

func (w *writer) run(ctx context.Context) {
	// Stopping takes effect between writes: a write cancelled in flight
	// may or may not have reached the server, and the bookkeeping of
	// what was written must be exact.
	stop := ctx
	ctx = context.WithoutCancel(ctx)
	for i := 0; stop.Err() == nil; i++ {
		for _, va := range w.e.vas() {
			if stop.Err() != nil {
				return
			}
			key := fmt.Sprintf("example.com/writer-%d", i%7)
			val := fmt.Sprintf("%d", i)
			var err error
			if i%2 == 0 {
				patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q},"labels":{"writer":%q}}}`, key, val, val)
				_, err = w.e.client.StorageV1().VolumeAttachments().Patch(ctx, va.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{FieldManager: "test-writer"})
			} else {
				err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
					cur, err := w.e.client.StorageV1().VolumeAttachments().Get(ctx, va.Name, metav1.GetOptions{})
					if err != nil {
						return err
					}
					cur = cur.DeepCopy()
					if cur.Annotations == nil {
						cur.Annotations = map[string]string{}
					}
					cur.Annotations[key] = val
					_, err = w.e.client.StorageV1().VolumeAttachments().Update(ctx, cur, metav1.UpdateOptions{FieldManager: "test-writer"})
					return err
				})
			}
			if err != nil {
				continue // gone, or the test is over
			}
			w.mu.Lock()
			if w.written[va.Name] == nil {
				w.written[va.Name] = map[string]string{}
			}
			w.written[va.Name][key] = val
			w.writes++
			w.mu.Unlock()
		}
		time.Sleep(w.pause)
	}
}

func TestConcurrentWriterOnVolumeAttachments_nothingOverwritten(t *testing.T) {
	e := newEnv(t, options{})
	node := e.addNode("n1")
	const n = 10
	pvs := e.volumes(n)
	// Slow publishes keep the attacher's metadata and status writes racing
	// with the writer's.
	e.fault(csimock.Rule{Method: "ControllerPublishVolume", Latency: 200 * time.Millisecond})
	e.fault(csimock.Rule{Method: "ControllerUnpublishVolume", Latency: 200 * time.Millisecond})
	w := &writer{e: e, pause: 250 * time.Millisecond, written: map[string]map[string]string{}}
	// A write by another client can reach csi-attacher's cache between its
	// publish and the watch event of its own status write. It is not a
	// disruption: the invariant check allows no repeated publish for it.
	wctx, stopWriter := context.WithCancel(e.ctx)
	done := make(chan struct{})
	go func() { defer close(done); w.run(wctx) }()
	for i, pv := range pvs {
		e.pod(fmt.Sprintf("p%d", i), node, pv)
	}
	for _, pv := range pvs {
		e.waitAttached(pv, node)
	}
	time.Sleep(time.Second)
	stopWriter()
	<-done
	if w.writes < n {
		t.Fatalf("the writer managed only %d writes", w.writes)
	}
	for _, pv := range pvs {
		name := e.vaName(pv, node)
		va, err := e.client.StorageV1().VolumeAttachments().Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var lost []string
		for k, v := range w.written[name] {
			if va.Annotations[k] != v {
				lost = append(lost, fmt.Sprintf("%s = %q, last written %q", k, va.Annotations[k], v))
			}
		}
		if len(lost) > 0 {
			t.Errorf("VolumeAttachment %s lost the writer's annotations: %v; managed fields %+v", name, lost, va.ManagedFields)
		}
		if va.Labels["writer"] == "" {
			t.Errorf("VolumeAttachment %s lost the writer's label: %v", name, va.Labels)
		}
		if va.Annotations[attacher.AnnVolumeHandle] != pv || va.Annotations[kubenames.VANodeIDAnnotation] != e.nodeID(node) {
			t.Errorf("VolumeAttachment %s lost the attacher's annotations: %v", name, va.Annotations)
		}
		if !slices.Contains(va.Finalizers, kubenames.AttacherFinalizer(e.driver)) || !va.Status.Attached {
			t.Errorf("VolumeAttachment %s: finalizers %v, attached %v", name, va.Finalizers, va.Status.Attached)
		}
	}
	e.checkInvariants(30 * time.Second)

	// The writer keeps writing, without pause, while everything detaches:
	// finalizer removal must not be starved by writes to other fields.
	w.pause = 0
	wctx, stopWriter = context.WithCancel(e.ctx)
	done = make(chan struct{})
	go func() { defer close(done); w.run(wctx) }()
	defer func() { stopWriter(); <-done }()
	e.teardownClean()
}

func TestNodeFailuresDuringAttachAndDetach_bothControllers(t *testing.T) {
	e := newEnv(t, options{ctrl: controllerConfigForNodeFailures()})
	gone, sick, fenced := e.addNode("gone"), e.addNode("sick"), e.addNode("fenced")
	pvGone, pvSick, pvFenced := e.volume("gone"), e.volume("sick"), e.volume("fenced")

	// sick: attached first; the node turns NotReady, its Pod is deleted
	// and the detach runs against a node that cannot confirm the unmount.
	e.pod("p-sick", sick, pvSick)
	e.waitAttached(pvSick, sick)

	// gone and fenced: the publish is in flight when the node fails.
	e.fault(csimock.Rule{Method: "ControllerPublishVolume", VolumeID: pvGone, Once: true, Latency: 2 * time.Second})
	e.fault(csimock.Rule{Method: "ControllerPublishVolume", VolumeID: pvFenced, Once: true, Latency: 2 * time.Second})
	e.fault(csimock.Rule{Method: "ControllerUnpublishVolume", VolumeID: pvSick, Once: true, Latency: 2 * time.Second})
	e.pod("p-gone", gone, pvGone)
	e.pod("p-fenced", fenced, pvFenced)
	e.eventually(30*time.Second, "both publishes in flight", func() bool {
		return e.inFlight("ControllerPublishVolume", pvGone) && e.inFlight("ControllerPublishVolume", pvFenced)
	})
	if err := e.kubelet.SetReady(e.ctx, sick, false); err != nil {
		t.Fatal(err)
	}
	e.deletePod("p-sick")
	if err := e.kubelet.DeleteNode(e.ctx, gone); err != nil {
		t.Fatal(err)
	}
	forceDelete(t, e, "p-gone") // the pod GC removes Pods of deleted nodes
	if err := e.kubelet.SetReady(e.ctx, fenced, false); err != nil {
		t.Fatal(err)
	}
	if err := e.kubelet.Taint(e.ctx, fenced, v1.Taint{Key: localcluster.OutOfServiceTaint, Value: "shutdown", Effect: v1.TaintEffectNoExecute}); err != nil {
		t.Fatal(err)
	}
	forceDelete(t, e, "p-fenced")

	e.waitGone(pvGone, gone)
	e.waitGone(pvFenced, fenced)
	e.waitGone(pvSick, sick)
	for _, pv := range []string{pvGone, pvFenced, pvSick} {
		if got := e.mock.Published(pv); len(got) != 0 {
			t.Errorf("%s is still published to %v after its node failed and its VolumeAttachment went", pv, got)
		}
	}
	// Each volume can move on: a new Pod on a healthy node attaches it.
	healthy := e.addNode("healthy")
	for i, pv := range []string{pvGone, pvFenced, pvSick} {
		e.pod(fmt.Sprintf("again-%d", i), healthy, pv)
	}
	for _, pv := range []string{pvGone, pvFenced, pvSick} {
		e.waitAttached(pv, healthy)
	}
	e.checkInvariants(30 * time.Second)
	e.teardownClean()
}

func forceDelete(t *testing.T, e *env, pod string) {
	t.Helper()
	err := e.client.CoreV1().Pods(e.ns).Delete(e.ctx, pod, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
}

// controllerConfigForNodeFailures waits a short time for a NotReady node's
// unmount before forcing the detach, so the test does not wait the default
// six minutes.
func controllerConfigForNodeFailures() controller.Config {
	return controller.Config{Workers: 8, MaxWaitForUnmount: 3 * time.Second}
}

func TestExclusiveVolumeMovesNodes_notPublishedToTheNewNodeBeforeUnpublishedFromTheOld(t *testing.T) {
	e := newEnv(t, options{})
	n1, n2 := e.addNode("n1"), e.addNode("n2")
	const n = 6
	pvs := e.volumes(n)
	e.podsOn("old", n1, pvs)
	// The unpublish from n1 fails for a while: until it succeeds, n2 must
	// not get the volume, however quickly the new Pod asks for it.
	for _, pv := range pvs {
		e.fault(csimock.Rule{Method: "ControllerUnpublishVolume", VolumeID: pv, Times: 3, Code: codes.Internal, Message: "still detaching"})
	}
	for i, pv := range pvs {
		e.deletePod(fmt.Sprintf("old%d", i))
		e.pod(fmt.Sprintf("new%d", i), n2, pv)
	}
	for _, pv := range pvs {
		e.waitAttached(pv, n2)
	}
	for _, pv := range pvs {
		var unpublished, published time.Time
		for _, c := range e.mock.Calls() {
			switch {
			case c.VolumeID == pv && c.Method == "ControllerUnpublishVolume" && c.Code == codes.OK:
				unpublished = c.End
			case c.VolumeID == pv && c.Method == "ControllerPublishVolume" && c.NodeID == e.nodeID(n2) && published.IsZero():
				published = c.Start
			}
		}
		if unpublished.IsZero() || published.Before(unpublished) {
			t.Errorf("%s: publish to n2 started at %s, unpublish from n1 finished at %s", pv, published.Format(time.StampMicro), unpublished.Format(time.StampMicro))
		}
	}
	e.checkInvariants(30 * time.Second)
	e.teardownClean()
}

func TestExclusiveVolumeReleasedWhileTwoNodesWait_onlyOneGetsIt(t *testing.T) {
	e := newEnv(t, options{})
	n0, n1, n2 := e.addNode("n0"), e.addNode("n1"), e.addNode("n2")
	const n = 30
	pvs := e.volumes(n)
	e.podsOn("first", n0, pvs)
	// Two more nodes want each volume and wait; when n0 lets go, both
	// waiting keys wake at once and the controller's workers decide on
	// them concurrently.
	for i, pv := range pvs {
		e.pod(fmt.Sprintf("a%d", i), n1, pv)
		e.pod(fmt.Sprintf("b%d", i), n2, pv)
	}
	time.Sleep(time.Second)
	for i := range pvs {
		e.deletePod(fmt.Sprintf("first%d", i))
	}
	e.eventually(60*time.Second, "each volume attached on one of the waiting nodes", func() bool {
		attached := 0
		for _, va := range e.vas() {
			if va.Status.Attached && va.Spec.NodeName != n0 {
				attached++
			}
		}
		return attached >= n
	})
	time.Sleep(time.Second)
	for _, pv := range pvs {
		var on []string
		for _, va := range e.vas() {
			if ptrStr(va.Spec.Source.PersistentVolumeName) == pv {
				on = append(on, va.Spec.NodeName)
			}
		}
		if len(on) != 1 {
			t.Errorf("%s has VolumeAttachments on %v, want exactly one node", pv, on)
		}
	}
	e.checkInvariants(30 * time.Second)
	e.teardownClean()
}
