package interop

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/latchcsi/latch/internal/csimock"
)

// swapAttacherArgs are upstream's deploy example (deploy/kubernetes/
// deployment.yaml of external-attacher v4.13.0: --v=5, --csi-address,
// --leader-election, --http-endpoint) plus flags drivers commonly pass:
// the Lease namespace (the Pod's, from the downward API), shorter leader
// election timings, a leader-election label in upstream's key:value form,
// an upstream feature gate, and timeouts.
var swapAttacherArgs = []string{
	"--leader-election", "--leader-election-namespace=default",
	"--leader-election-lease-duration=6s", "--leader-election-renew-deadline=4s", "--leader-election-retry-period=1s",
	"--leader-election-labels=app:csi-attacher",
	"--feature-gates=ReleaseLeaderElectionOnExit=false",
	"--worker-threads=10", "--kube-api-qps=50", "--kube-api-burst=100",
}

// leaseName is the attacher's Lease for the driver.
const leaseName = "external-attacher-leader-pd-csi-storage-gke-io"

// workload keeps track of what a swap test wants attached where.
type workload struct {
	w    *world
	ns   string
	n    int
	vols []string          // every volume it created
	want map[string]string // pod → its volume, for Pods that must run
	node map[string]string // pod → node
	// uids are the VolumeAttachment UIDs of the volumes attached before a
	// swap: a wanted volume keeps its VolumeAttachment across it.
	uids map[string]types.UID
	// pubs are the successful publishes of each volume seen at the last
	// settled: a volume attached before a swap is not published again.
	pubs map[string]int
}

func newWorkload(w *world, ns string) *workload {
	return &workload{w: w, ns: w.namespace(ns), want: map[string]string{}, node: map[string]string{}, uids: map[string]types.UID{}, pubs: map[string]int{}}
}

// add creates count Pods, each with a volume of its own, spread over the
// two nodes: the volumes first, then the Pods.
func (l *workload) add(count int) {
	first := l.n + 1
	for range count {
		l.n++
		vol := fmt.Sprintf("%s-vol-%d", l.ns, l.n)
		l.w.volume(l.ns, vol)
		l.vols = append(l.vols, vol)
	}
	for i := first; i <= l.n; i++ {
		pod, vol, node := fmt.Sprintf("app-%d", i), fmt.Sprintf("%s-vol-%d", l.ns, i), worldNodes[i%2]
		l.w.pod(l.ns, pod, node, vol)
		l.want[pod], l.node[pod] = vol, node
	}
}

// remove deletes count of the wanted Pods.
func (l *workload) remove(count int) (gone [][2]string) {
	for pod, vol := range l.want {
		if count == 0 {
			break
		}
		l.w.deletePod(l.ns, pod)
		gone = append(gone, [2]string{vol, l.node[pod]})
		delete(l.want, pod)
		count--
	}
	return gone
}

// settled waits until every wanted Pod runs with its volume attached
// (VA attached, in node status) and every released volume's VA is gone
// and unpublished; it records the VA UIDs and publish counts. A volume
// attached at the previous settled is not published again; a new one is
// published at least once, and exactly once when exact (latch's attacher
// alone attached it: upstream's may publish twice after reading its own
// write from a stale cache, see docs/interop.md).
func (l *workload) settled(gone [][2]string, exact bool) {
	w := l.w
	w.t.Helper()
	for pod, vol := range l.want {
		va := w.waitAttached(vol, l.node[pod])
		if old, ok := l.uids[vol]; ok && old != va.UID {
			w.t.Errorf("VolumeAttachment of wanted volume %s was re-created across the swap (uid %s, was %s)", vol, va.UID, old)
		}
		l.uids[vol] = va.UID
		w.waitPodRunning(l.ns, pod)
		w.eventually(fmt.Sprintf("%s in node %s volumesAttached", vol, l.node[pod]), func(context.Context) (bool, error) {
			for _, v := range w.attachedOn(l.node[pod]) {
				if v == unique(vol) {
					return true, nil
				}
			}
			return false, nil
		})
		got := w.calls("ControllerPublishVolume", vol, l.node[pod])[codes.OK]
		before, seen := l.pubs[vol]
		switch {
		case seen && got != before:
			w.t.Errorf("%s, attached before the swap, published to %s again: %d publishes, %d before", vol, l.node[pod], got, before)
		case !seen && (got < 1 || exact && got != 1):
			w.t.Errorf("%s published to %s %d times, want once", vol, l.node[pod], got)
		}
		l.pubs[vol] = got
		if got := w.calls("ControllerUnpublishVolume", vol, l.node[pod])[codes.OK]; got != 0 {
			w.t.Errorf("wanted volume %s unpublished from %s %d times across the swap", vol, l.node[pod], got)
		}
	}
	for _, g := range gone {
		w.waitVAGone(g[0], g[1])
		w.eventually(g[0]+" unpublished", func(context.Context) (bool, error) {
			return len(w.drv.Published(g[0])) == 0, nil
		})
		got := w.calls("ControllerPublishVolume", g[0], g[1])[codes.OK]
		if before, seen := l.pubs[g[0]]; seen && got != before {
			w.t.Errorf("released volume %s published to %s again while detaching: %d publishes, %d before", g[0], g[1], got, before)
		}
	}
}

// drain deletes every Pod and checks nothing is left: no VA, nothing
// published, no node status entry.
func (l *workload) drain() {
	w := l.w
	w.t.Helper()
	l.settled(l.remove(len(l.want)), false)
	for _, n := range worldNodes {
		w.waitNodeAttached(n)
	}
	vas, err := w.s.Client.StorageV1().VolumeAttachments().List(w.ctx, metav1.ListOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	for _, va := range vas.Items {
		w.t.Errorf("VolumeAttachment %s left after every Pod went: %s", va.Name, vaFacts(&va))
	}
}

// inFlight slows publishes down and starts attaches and detaches that are
// still running when the swap happens.
func (l *workload) inFlight() (gone [][2]string, stop func()) {
	id, err := l.w.drv.AddFault(csimock.Rule{Method: "ControllerPublishVolume", Latency: 2 * time.Second})
	if err != nil {
		l.w.t.Fatal(err)
	}
	l.add(3)
	gone = l.remove(2)
	return gone, func() { l.w.drv.RemoveFault(id) }
}

func (w *world) leaseHolder() (string, int32) {
	w.t.Helper()
	lease, err := w.s.Client.CoordinationV1().Leases("default").Get(w.ctx, leaseName, metav1.GetOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	var transitions int32
	if lease.Spec.LeaseTransitions != nil {
		transitions = *lease.Spec.LeaseTransitions
	}
	holder := ""
	if lease.Spec.HolderIdentity != nil {
		holder = *lease.Spec.HolderIdentity
	}
	return holder, transitions
}

// swapAttacher starts an attacher of kind beside the running one (a
// rolling update: the new Pod comes up as a standby), stops the old one
// and waits for the new one to hold the Lease.
func (w *world) swapAttacher(to atKind) {
	w.t.Helper()
	before, transitions := w.leaseHolder()
	next := w.startAttacher(to, swapAttacherArgs)
	w.stop(w.attacher)
	w.attacher = next
	var holder string
	w.eventually("the Lease handed over to "+next.name, func(context.Context) (bool, error) {
		var tr int32
		holder, tr = w.leaseHolder()
		return holder != "" && holder != before && tr > transitions, nil
	})
	// csi-lib-utils' source: the Lease name before it is made a valid
	// object name, "/", the identity.
	w.leaderElectionEvent("default", leaseName, holder, "external-attacher-leader-pd.csi.storage.gke.io/"+holder)
}

// leaderElectionEvent waits for the event client-go's elector records on
// the Lease ns/name when holder takes it: reason LeaderElection, message
// "<holder> became leader", from source. The upstream external-attacher,
// kube-controller-manager and both latch binaries record it; the source
// is each component's own.
func (w *world) leaderElectionEvent(ns, name, holder, source string) {
	w.t.Helper()
	var seen []string
	w.eventually(fmt.Sprintf("a LeaderElection event %q from %q on Lease %s/%s", holder+" became leader", source, ns, name), func(ctx context.Context) (bool, error) {
		events, err := w.s.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{
			FieldSelector: "involvedObject.kind=Lease,involvedObject.name=" + name,
		})
		if err != nil {
			return false, err
		}
		seen = seen[:0]
		for _, e := range events.Items {
			seen = append(seen, fmt.Sprintf("%s %s %q from %q", e.Type, e.Reason, e.Message, e.Source.Component))
			if e.Type == v1.EventTypeNormal && e.Reason == "LeaderElection" && e.Message == holder+" became leader" && e.Source.Component == source {
				return true, nil
			}
		}
		return false, nil
	}, func() { w.t.Logf("events on Lease %s/%s: %q", ns, name, seen) })
}

// TestSwapAttacher_upstreamToLatchAndBack replaces the upstream
// external-attacher by latch's csi-attacher with the same args while
// volumes attach and detach, then swaps back the same way.
func TestSwapAttacher_upstreamToLatchAndBack(t *testing.T) {
	t.Parallel() // a world of its own, mostly waiting (worldsAtOnce)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	w := newWorld(t, ctx, pair{kcmAD, upAt})
	w.stop(w.attacher)
	w.attacher = w.startAttacher(upAt, swapAttacherArgs)
	l := newWorkload(w, "swap-at")
	l.add(4)
	l.settled(nil, false)

	for _, to := range []atKind{latchAt, upAt} {
		gone, stop := l.inFlight()
		w.swapAttacher(to)
		stop()
		l.settled(gone, false)
		// The new attacher leads and works: new Pods attach.
		l.add(2)
		l.settled(nil, to == latchAt)
	}
	l.checkPVFinalizers()
	l.drain()
	l.checkPVFinalizersGone()
}
