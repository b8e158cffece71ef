package kubeletorder

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// Change is one watch event as the test saw it. RV is the object's
// resourceVersion: etcd's revision, one counter for every resource, so
// comparing two RVs orders two writes exactly (the observed time only
// bounds a write from above).
type Change struct {
	Type     watch.EventType
	RV       uint64
	Observed time.Time
	Obj      runtime.Object
}

// History records every change of Nodes, VolumeAttachments and the Pods
// of one namespace from the moment it starts.
type History struct {
	mu      sync.Mutex
	changes []Change
}

// Record watches from the current resource version of each list until
// the test ends. A watch that ends, cleanly or with an error (an API
// server restart), is resumed from the last resourceVersion it
// delivered (see follow); an event the history cannot record fails the
// test: the history would have a hole.
func Record(t testing.TB, ctx context.Context, client kubernetes.Interface, ns string) *History {
	t.Helper()
	h := &History{}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	for _, s := range []source{
		{"nodes", func() (runtime.Object, error) {
			return client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		}, func(rv string) (watch.Interface, error) {
			return client.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true})
		}},
		{"volumeattachments", func() (runtime.Object, error) {
			return client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
		}, func(rv string) (watch.Interface, error) {
			return client.StorageV1().VolumeAttachments().Watch(ctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true})
		}},
		{"pods", func() (runtime.Object, error) {
			return client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		}, func(rv string) (watch.Interface, error) {
			return client.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true})
		}},
	} {
		l, err := s.list()
		if err != nil {
			t.Fatalf("list %s: %v", s.what, err)
		}
		rv, known, err := listed(l)
		if err != nil {
			t.Fatalf("list %s: %v", s.what, err)
		}
		wi, err := s.watch(strconv.FormatUint(rv, 10))
		if err != nil {
			t.Fatalf("watch %s: %v", s.what, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.follow(ctx, t, s, wi, rv, known)
		}()
	}
	return h
}

// First is the earliest recorded change (by RV) that match accepts.
func (h *History) First(match func(Change) bool) (Change, bool) {
	return h.pick(match, func(c, best Change) bool { return c.RV < best.RV })
}

// MustFirst is First that fails the test, naming what was looked for.
// The history is fed by watches, which trail the GETs a test waits on: a
// change the test has already seen through a GET may not be recorded
// yet, so MustFirst waits up to RecordLag for it before failing. The
// watch of one resource delivers its changes in RV order, so the first
// match recorded is the first there is.
func (h *History) MustFirst(t testing.TB, what string, match func(Change) bool) Change {
	t.Helper()
	deadline := time.Now().Add(RecordLag)
	for {
		c, ok := h.First(match)
		if ok {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("no recorded change within %s: %s", RecordLag, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// RecordLag bounds how long a watch event may trail the write it reports
// on the loopback API server of these tests.
const RecordLag = 30 * time.Second

// Last is the latest recorded change (by RV) that match accepts.
func (h *History) Last(match func(Change) bool) (Change, bool) {
	return h.pick(match, func(c, best Change) bool { return c.RV > best.RV })
}

// pick is the recorded change that match accepts and that beats every
// other such change (better(c, best) says c beats best).
func (h *History) pick(match func(Change) bool, better func(c, best Change) bool) (Change, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var best Change
	found := false
	for _, c := range h.changes {
		if match(c) && (!found || better(c, best)) {
			best, found = c, true
		}
	}
	return best, found
}

// VANamed matches the changes of VolumeAttachment name for which cond
// holds.
func VANamed(name string, cond func(*storagev1.VolumeAttachment) bool) func(Change) bool {
	return func(c Change) bool {
		va, ok := c.Obj.(*storagev1.VolumeAttachment)
		return ok && va.Name == name && cond(va)
	}
}

// PodNamed matches the changes of Pod name for which cond holds.
func PodNamed(name string, cond func(*v1.Pod) bool) func(Change) bool {
	return func(c Change) bool {
		p, ok := c.Obj.(*v1.Pod)
		return ok && p.Name == name && cond(p)
	}
}

// NodeNamed matches the changes of Node name for which cond holds.
func NodeNamed(name string, cond func(*v1.Node) bool) func(Change) bool {
	return func(c Change) bool {
		n, ok := c.Obj.(*v1.Node)
		return ok && n.Name == name && cond(n)
	}
}

// Attached reports whether n's status.volumesAttached lists vol.
func Attached(n *v1.Node, vol v1.UniqueVolumeName) bool {
	for _, a := range n.Status.VolumesAttached {
		if a.Name == vol {
			return true
		}
	}
	return false
}

// InUse reports whether n's status lists vol in volumesInUse.
func InUse(n *v1.Node, vol v1.UniqueVolumeName) bool {
	for _, u := range n.Status.VolumesInUse {
		if u == vol {
			return true
		}
	}
	return false
}

// After matches the changes of match with an RV above rv.
func After(rv uint64, match func(Change) bool) func(Change) bool {
	return func(c Change) bool { return c.RV > rv && match(c) }
}

func (c Change) String() string {
	m := c.Obj.(metav1.Object)
	return fmt.Sprintf("%s %T %s at RV %d (seen %s)", c.Type, c.Obj, m.GetName(), c.RV, c.Observed.Format("15:04:05.000"))
}
