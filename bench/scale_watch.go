package bench

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/latchcsi/latch/internal/kube"
)

// placement is a volume (its PV's name) on a node.
type placement struct{ pv, node string }

// attachWatcher follows the run driver's VolumeAttachments and every
// Node's status.volumesAttached through the API server's watch, and
// records for each (volume, node) when it was first seen attached (VA
// status.attached) and listed in the node's status, and whether a volume
// ever had two attached VolumeAttachments at once. The trickle and the
// recovery burst time their attaches and check their detaches with it.
type attachWatcher struct {
	driver, prefix string
	stop           context.CancelFunc
	done           chan struct{}

	mu sync.Mutex
	// vaAttached: the VA of a placement exists and is attached (a VA
	// being deleted still counts until it is gone: the volume stays
	// published until the attacher removes its finalizer).
	vaAttached map[placement]bool
	vaExists   map[placement]bool
	// listed: per node, the volumes in its status.volumesAttached.
	listed map[string]map[string]bool
	// both is when a placement was first attached and listed at once.
	both map[placement]time.Time
	// times are when a placement's VA was first seen, first attached and
	// gone, and when it was first listed in its node's status.
	times map[placement]*vaTimes
	// attachedVAs: per volume, the names of its attached VAs.
	attachedVAs map[string]map[string]bool
	// doubles: volumes seen with two attached VAs at once.
	doubles map[string]bool
}

// watchAttachments starts an attachWatcher and waits for its caches.
func watchAttachments(ctx context.Context, client kubernetes.Interface, driver string) (*attachWatcher, error) {
	aw := newAttachWatcher(driver)
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	aw.stop = cancel
	f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(kube.StripManagedFields))
	vas := f.Storage().V1().VolumeAttachments().Informer()
	nodes := f.Core().V1().Nodes().Informer()
	_, _ = vas.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { aw.onVA(obj, false) },
		UpdateFunc: func(_, obj any) { aw.onVA(obj, false) },
		DeleteFunc: func(obj any) { aw.onVA(obj, true) },
	})
	_, _ = nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { aw.onNode(obj, false) },
		UpdateFunc: func(_, obj any) { aw.onNode(obj, false) },
		DeleteFunc: func(obj any) { aw.onNode(obj, true) },
	})
	f.Start(wctx.Done())
	go func() { <-wctx.Done(); f.Shutdown(); close(aw.done) }()
	for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
		if !ok {
			aw.close()
			return nil, fmt.Errorf("watch %v: caches not synced", typ)
		}
	}
	return aw, nil
}

func newAttachWatcher(driver string) *attachWatcher {
	return &attachWatcher{
		driver: driver, prefix: uniqueNamePrefix(driver), done: make(chan struct{}),
		vaAttached: map[placement]bool{}, vaExists: map[placement]bool{}, listed: map[string]map[string]bool{},
		both: map[placement]time.Time{}, times: map[placement]*vaTimes{}, attachedVAs: map[string]map[string]bool{}, doubles: map[string]bool{},
	}
}

// vaTimes are the moments of one placement's VolumeAttachment (zero:
// not seen).
type vaTimes struct{ created, attached, listed, gone time.Time }

func (aw *attachWatcher) timesOf(p placement) *vaTimes {
	t := aw.times[p]
	if t == nil {
		t = &vaTimes{}
		aw.times[p] = t
	}
	return t
}

// timesAt returns a copy of p's moments.
func (aw *attachWatcher) timesAt(p placement) vaTimes {
	aw.mu.Lock()
	defer aw.mu.Unlock()
	if t := aw.times[p]; t != nil {
		return *t
	}
	return vaTimes{}
}

// uniqueNamePrefix is the prefix of a CSI driver's volumes' names in
// Node status ("kubernetes.io/csi/<driver>^").
func uniqueNamePrefix(driver string) string { return "kubernetes.io/csi/" + driver + "^" }

func (aw *attachWatcher) close() {
	aw.stop()
	<-aw.done
}

func (aw *attachWatcher) onVA(obj any, deleted bool) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	va, ok := obj.(*storagev1.VolumeAttachment)
	if !ok || va.Spec.Attacher != aw.driver || va.Spec.Source.PersistentVolumeName == nil {
		return
	}
	now := time.Now()
	pv := *va.Spec.Source.PersistentVolumeName
	p := placement{pv: pv, node: va.Spec.NodeName}
	attached := !deleted && va.Status.Attached
	aw.mu.Lock()
	defer aw.mu.Unlock()
	aw.vaExists[p] = !deleted
	aw.vaAttached[p] = attached
	t := aw.timesOf(p)
	switch {
	case deleted:
		t.gone = now
	case t.created.IsZero():
		t.created = now
	}
	if attached && t.attached.IsZero() {
		t.attached = now
	}
	names := aw.attachedVAs[pv]
	if attached {
		if names == nil {
			names = map[string]bool{}
			aw.attachedVAs[pv] = names
		}
		names[va.Name] = true
		if len(names) > 1 {
			aw.doubles[pv] = true
		}
	} else if names != nil {
		delete(names, va.Name)
	}
	aw.settle(p, now)
}

func (aw *attachWatcher) onNode(obj any, deleted bool) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	node, ok := obj.(*v1.Node)
	if !ok {
		return
	}
	now := time.Now()
	aw.mu.Lock()
	defer aw.mu.Unlock()
	listed := map[string]bool{}
	if !deleted {
		for _, a := range node.Status.VolumesAttached {
			if pv, ok := strings.CutPrefix(string(a.Name), aw.prefix); ok {
				listed[pv] = true
			}
		}
	}
	aw.listed[node.Name] = listed
	for pv := range listed {
		p := placement{pv: pv, node: node.Name}
		if t := aw.times[p]; t != nil && t.listed.IsZero() {
			t.listed = now
		}
		aw.settle(p, now)
	}
}

// settle records when p was first attached and listed at once.
func (aw *attachWatcher) settle(p placement, now time.Time) {
	if _, seen := aw.both[p]; !seen && aw.vaAttached[p] && aw.listed[p.node][p.pv] {
		aw.both[p] = now
	}
}

// attachedAt is when p was first attached and listed in its node's status.
func (aw *attachWatcher) attachedAt(p placement) (time.Time, bool) {
	aw.mu.Lock()
	defer aw.mu.Unlock()
	t, ok := aw.both[p]
	return t, ok
}

// awaited is a volume the harness waits to see attached at a placement,
// and since when it is wanted there.
type awaited struct {
	at    placement
	since time.Time
}

// waitAttached waits, up to the action timeout, until every one of vols
// is attached at its placement (the wait's end is logged, not an error:
// the caller checks the count). It returns how many are attached, the
// latency of each from its since time, and the last attach.
func (e *scaleEnv) waitAttached(ctx context.Context, p *scaleProc, aw *attachWatcher, what string, vols []awaited) (n int, lat []time.Duration, last time.Time) {
	_ = p.waitUntil(ctx, e.sz.ActionTimeout, what, func(context.Context) bool { return aw.attachedCount(vols) == len(vols) })
	for _, v := range vols {
		if at, ok := aw.attachedAt(v.at); ok {
			n++
			lat = append(lat, at.Sub(v.since))
			if at.After(last) {
				last = at
			}
		}
	}
	return n, lat, last
}

// attachedCount is how many of vols are attached at their placement.
func (aw *attachWatcher) attachedCount(vols []awaited) int {
	n := 0
	for _, v := range vols {
		if _, ok := aw.attachedAt(v.at); ok {
			n++
		}
	}
	return n
}

// detached tells whether p's VolumeAttachment is gone and p's volume is
// not in its node's status.
func (aw *attachWatcher) detached(p placement) bool {
	aw.mu.Lock()
	defer aw.mu.Unlock()
	return !aw.vaExists[p] && !aw.listed[p.node][p.pv]
}

// vaGone tells whether p's VolumeAttachment is gone.
func (aw *attachWatcher) vaGone(p placement) bool {
	aw.mu.Lock()
	defer aw.mu.Unlock()
	return !aw.vaExists[p]
}

// doubleAttached returns the volumes among pvs (all when nil) seen with
// two attached VolumeAttachments at once.
func (aw *attachWatcher) doubleAttached(pvs map[string]bool) []string {
	aw.mu.Lock()
	defer aw.mu.Unlock()
	var out []string
	for pv := range aw.doubles {
		if pvs == nil || pvs[pv] {
			out = append(out, pv)
		}
	}
	return out
}
