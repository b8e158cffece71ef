package reliability_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/latchcsi/latch/internal/attacher"
	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// claimLog records, from a watch of the driver's VolumeAttachments, when
// each one claimed a publication: attached, carrying our finalizer, not
// being deleted, with the volume handle and node ID latch records before
// every publish (invariant 8: nothing unpublishes what such a
// VolumeAttachment claims; an orphan of the record least of all).
type claimLog struct {
	driver string
	now    func() time.Time
	// live reads a VolumeAttachment from the API server (nil: no reads):
	// a claim still open in the log is judged only when the object still
	// claims it, since a watch held back by an API server restart may not
	// have shown its end yet.
	live func(name string) (*storagev1.VolumeAttachment, error)
	mu   sync.Mutex
	// open is the claim each VolumeAttachment (by UID) holds now.
	open map[types.UID]claimSpan
	// closed are the claims that ended.
	closed []claimSpan
}

// claimSpan is one VolumeAttachment's claim of (handle, nodeID) from from
// to to (zero while it lasts), in the watch's time. A claim that ended when
// its VolumeAttachment was deleted ends at its deletionTimestamp, which the
// API server set before anything could detach it (whole seconds, rounded
// down: never after the deletion); one whose end the watch missed (the
// object vanished during a relist) has an unknown end and judges nothing.
type claimSpan struct {
	va, handle, nodeID string
	uid                types.UID
	from, to           time.Time
	endUnknown         bool
}

// startClaimLog watches the driver's VolumeAttachments until ctx is done.
func startClaimLog(ctx context.Context, client kubernetes.Interface, driver string) *claimLog {
	l := &claimLog{driver: driver, now: time.Now, open: map[types.UID]claimSpan{},
		live: func(name string) (*storagev1.VolumeAttachment, error) {
			return client.StorageV1().VolumeAttachments().Get(ctx, name, metav1.GetOptions{})
		}}
	factory := informers.NewSharedInformerFactory(client, 0)
	inf := factory.Storage().V1().VolumeAttachments().Informer()
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { l.observe(obj, false) },
		UpdateFunc: func(_, obj any) { l.observe(obj, false) },
		DeleteFunc: func(obj any) { l.observe(obj, true) },
	})
	factory.Start(ctx.Done())
	return l
}

func (l *claimLog) observe(obj any, gone bool) {
	tomb, missed := obj.(cache.DeletedFinalStateUnknown)
	if missed {
		obj = tomb.Obj
	}
	va, ok := obj.(*storagev1.VolumeAttachment)
	if !ok || va.Spec.Attacher != l.driver {
		return
	}
	now := l.now()
	handle, nodeID, claims := l.claim(va)
	claims = claims && !gone
	l.mu.Lock()
	defer l.mu.Unlock()
	cur, has := l.open[va.UID]
	if has && (!claims || cur.handle != handle || cur.nodeID != nodeID) {
		cur.to = now
		switch {
		case va.DeletionTimestamp != nil && va.DeletionTimestamp.Time.Before(now):
			cur.to = va.DeletionTimestamp.Time
		case missed:
			cur.endUnknown = true
		}
		l.closed = append(l.closed, cur)
		delete(l.open, va.UID)
		has = false
	}
	if claims && !has {
		l.open[va.UID] = claimSpan{va: va.Name, uid: va.UID, handle: handle, nodeID: nodeID, from: now}
	}
}

// claim returns the publication va claims, if any.
func (l *claimLog) claim(va *storagev1.VolumeAttachment) (handle, nodeID string, ok bool) {
	handle, nodeID = va.Annotations[attacher.AnnVolumeHandle], va.Annotations[kubenames.VANodeIDAnnotation]
	ok = va.DeletionTimestamp == nil && va.Status.Attached && handle != "" && nodeID != "" &&
		slices.Contains(va.Finalizers, kubenames.AttacherFinalizer(l.driver))
	return handle, nodeID, ok
}

// claimMargin widens a call's time when judging it against the watch: the
// watch sees a VolumeAttachment's change a little after the controllers.
const claimMargin = time.Second

// claimedThroughout returns the VolumeAttachment that claimed (handle,
// nodeID) from before from until after to, "" when none did.
func (l *claimLog) claimedThroughout(handle, nodeID string, from, to time.Time) string {
	l.mu.Lock()
	spans := slices.Clone(l.closed)
	for _, s := range l.open {
		spans = append(spans, s)
	}
	l.mu.Unlock()
	for _, s := range spans {
		if s.handle != handle || s.nodeID != nodeID || s.endUnknown || s.from.After(from) || !s.to.IsZero() && s.to.Before(to) {
			continue
		}
		if s.to.IsZero() && l.live != nil {
			cur, err := l.live(s.va)
			if err != nil {
				continue
			}
			if h, n, ok := l.claim(cur); !ok || cur.UID != s.uid || h != handle || n != nodeID {
				continue
			}
		}
		return s.va
	}
	return ""
}

// claimedUnpublishes judges invariant 8 on the driver's calls: it returns
// one line for every successful ControllerUnpublish of a (volume handle,
// node ID) that a VolumeAttachment claimed from a margin before the call
// until a margin after it (a detach's unpublish follows the deletion of
// its VolumeAttachment, so it never is). A call near a disruption the test
// made (disrupted names it) is not judged: an API server restart holds the
// watch's view of the VolumeAttachments back by seconds.
func (l *claimLog) claimedUnpublishes(calls []csimock.Call, disrupted func(from, to time.Time) string) []string {
	var out []string
	for _, c := range calls {
		if !c.Done() || c.Method != "ControllerUnpublishVolume" || c.Code != codes.OK {
			continue
		}
		if disrupted != nil && disrupted(c.Start.Add(-claimMargin), c.End.Add(claimMargin)) != "" {
			continue
		}
		if va := l.claimedThroughout(c.VolumeID, c.NodeID, c.Start.Add(-claimMargin), c.End.Add(claimMargin)); va != "" {
			out = append(out, "ControllerUnpublishVolume of "+c.VolumeID+" from "+c.NodeID+" at "+c.Start.Format(time.StampMicro)+
				" while VolumeAttachment "+va+", attached with our finalizer, claimed it")
		}
	}
	return out
}

// The invariant 8 checker flags an unpublish made while a VolumeAttachment
// claimed the publication before and after it, and not a detach's
// unpublish, made once the VolumeAttachment is being deleted.
func TestClaimLogFlagsOnlyUnpublishesOfClaimedPublications(t *testing.T) {
	driver := "claims.csi.latch.dev"
	clock := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	l := &claimLog{driver: driver, now: func() time.Time { return clock }, open: map[types.UID]claimSpan{}}
	va := claimingVA(driver)
	l.observe(va, false)
	clock = clock.Add(3 * claimMargin)
	call := func(at time.Time) csimock.Call {
		return csimock.Call{Method: "ControllerUnpublishVolume", VolumeID: "vol-1", NodeID: "n1", Start: at, End: at.Add(time.Millisecond), Code: codes.OK}
	}
	during := call(clock.Add(-claimMargin - time.Millisecond))
	if bad := l.claimedUnpublishes([]csimock.Call{during}, nil); len(bad) != 1 {
		t.Errorf("unpublish while va-1 claims vol-1 on n1 (open claim): %v, want it flagged", bad)
	}
	// The deletion, at clock, reaches the watch 5 s late (an API server
	// restart): the claim ends at the deletionTimestamp all the same.
	deleting := va.DeepCopy()
	deleted := metav1.NewTime(clock)
	deleting.DeletionTimestamp = &deleted
	detach := call(clock.Add(10 * time.Millisecond))
	clock = clock.Add(5 * time.Second)
	l.observe(deleting, false)
	if bad := l.claimedUnpublishes([]csimock.Call{detach}, nil); len(bad) != 0 {
		t.Errorf("the detach's unpublish after the deletion: %v, want nothing flagged", bad)
	}
	if bad := l.claimedUnpublishes([]csimock.Call{during}, nil); len(bad) != 1 {
		t.Errorf("unpublish while va-1 claimed vol-1 on n1 (closed claim): %v, want it flagged", bad)
	}
	other := during
	other.NodeID = "n2"
	if bad := l.claimedUnpublishes([]csimock.Call{other}, nil); len(bad) != 0 {
		t.Errorf("unpublish from another node ID: %v, want nothing flagged", bad)
	}
}

// A claim whose end the watch missed (the object vanished during a
// relist) judges nothing; one a disruption overlapped neither.
func TestClaimLogJudgesNothingItCannotTime(t *testing.T) {
	driver := "claims.csi.latch.dev"
	clock := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	l := &claimLog{driver: driver, now: func() time.Time { return clock }, open: map[types.UID]claimSpan{}}
	va := claimingVA(driver)
	l.observe(va, false)
	unpublish := csimock.Call{Method: "ControllerUnpublishVolume", VolumeID: "vol-1", NodeID: "n1", Start: clock.Add(3 * time.Second), End: clock.Add(3*time.Second + time.Millisecond), Code: codes.OK}
	clock = clock.Add(10 * time.Second)
	if bad := l.claimedUnpublishes([]csimock.Call{unpublish}, func(from, to time.Time) string { return "API server restarted" }); len(bad) != 0 {
		t.Errorf("call during a disruption: %v, want nothing flagged", bad)
	}
	l.observe(cache.DeletedFinalStateUnknown{Key: "va-1", Obj: va}, true)
	if bad := l.claimedUnpublishes([]csimock.Call{unpublish}, nil); len(bad) != 0 {
		t.Errorf("claim whose end the watch missed: %v, want nothing flagged", bad)
	}
}

// claimingVA is va-1, attached by driver with vol-1 on node ID n1.
func claimingVA(driver string) *storagev1.VolumeAttachment {
	return &storagev1.VolumeAttachment{
		ObjectMeta: metav1.ObjectMeta{Name: "va-1", UID: "u1", Finalizers: []string{kubenames.AttacherFinalizer(driver)},
			Annotations: map[string]string{attacher.AnnVolumeHandle: "vol-1", kubenames.VANodeIDAnnotation: "n1"}},
		Spec:   storagev1.VolumeAttachmentSpec{Attacher: driver},
		Status: storagev1.VolumeAttachmentStatus{Attached: true},
	}
}
