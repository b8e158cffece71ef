package kubeletorder

import (
	"context"
	"strconv"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
)

// source is one resource the History records.
type source struct {
	what  string
	list  func() (runtime.Object, error)
	watch func(rv string) (watch.Interface, error)
}

// listed returns a list's resourceVersion and its objects by
// namespace/name.
func listed(l runtime.Object) (uint64, map[string]runtime.Object, error) {
	la, err := meta.ListAccessor(l)
	if err != nil {
		return 0, nil, err
	}
	rv, err := strconv.ParseUint(la.GetResourceVersion(), 10, 64)
	if err != nil {
		return 0, nil, err
	}
	items, err := meta.ExtractList(l)
	if err != nil {
		return 0, nil, err
	}
	objs := make(map[string]runtime.Object, len(items))
	for _, it := range items {
		m, err := meta.Accessor(it)
		if err != nil {
			return 0, nil, err
		}
		objs[m.GetNamespace()+"/"+m.GetName()] = it.DeepCopyObject()
	}
	return rv, objs, nil
}

// follow records wi's events until ctx ends. When the watch ends (the
// API server stopped, a test restarts it, and the connection closed or
// broke), follow watches again from the last resourceVersion delivered
// (bookmarks included), which loses nothing. A restarted API server's
// watch cache may start after that resourceVersion and refuse it (410):
// follow then lists, records each object that changed since (its state
// at the list, not the steps in between) and each one that went (at the
// list's resourceVersion), logs that it did, and watches from the list
// on.
func (h *History) follow(ctx context.Context, t testing.TB, s source, wi watch.Interface, last uint64, known map[string]runtime.Object) {
	for {
		expired, broke := h.drain(ctx, t, s, wi, &last, known)
		if broke || ctx.Err() != nil {
			return
		}
		t.Logf("kubeletorder history: the watch of %s ended at RV %d; watching again from there", s.what, last)
		wi = nil
		for wi == nil {
			if !expired {
				w, err := s.watch(strconv.FormatUint(last, 10))
				switch {
				case err == nil:
					wi = w
					continue
				case apierrors.IsResourceExpired(err) || apierrors.IsGone(err):
					expired = true
				default:
					if !pause(ctx) {
						return
					}
					continue
				}
			}
			l, err := s.list()
			if err != nil {
				if !pause(ctx) {
					return
				}
				continue
			}
			rv, now, err := listed(l)
			if err != nil {
				t.Errorf("relist %s: %v", s.what, err)
				return
			}
			h.relisted(t, s.what, last, rv, known, now)
			last, expired = rv, false
		}
	}
}

// pause waits a moment before the next try; false when ctx ended.
func pause(ctx context.Context) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(100 * time.Millisecond):
		return true
	}
}

// drain records wi's events until it ends. expired: the API server
// refused the resourceVersion (410). An error event ends the watch like
// its end does (client-go reports a connection that broke mid-stream,
// as on an API server restart, as an error event: "unable to decode an
// event from the watch stream"): what was delivered is recorded, and
// watching again from the last resourceVersion loses nothing. broke: an
// event the history cannot record, which fails the test.
func (h *History) drain(ctx context.Context, t testing.TB, s source, wi watch.Interface, last *uint64, known map[string]runtime.Object) (expired, broke bool) {
	defer wi.Stop()
	for ev := range wi.ResultChan() {
		if ev.Type == watch.Error {
			err := apierrors.FromObject(ev.Object)
			if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
				return true, false
			}
			if ctx.Err() == nil {
				t.Logf("kubeletorder history: the watch of %s ended with an error at RV %d: %v", s.what, *last, err)
			}
			// An error that comes back on every watch is retried at
			// pause's pace, not in a tight loop.
			pause(ctx)
			return false, false
		}
		m, err := meta.Accessor(ev.Object)
		if err != nil {
			t.Errorf("watch %s: %T: %v", s.what, ev.Object, err)
			return false, true
		}
		n, err := strconv.ParseUint(m.GetResourceVersion(), 10, 64)
		if err != nil {
			t.Errorf("watch %s: resourceVersion %q: %v", s.what, m.GetResourceVersion(), err)
			return false, true
		}
		*last = n
		if ev.Type == watch.Bookmark {
			continue
		}
		obj := ev.Object.DeepCopyObject()
		if k := m.GetNamespace() + "/" + m.GetName(); ev.Type == watch.Deleted {
			delete(known, k)
		} else {
			known[k] = obj
		}
		h.add(Change{Type: ev.Type, RV: n, Observed: time.Now(), Obj: obj})
	}
	return false, false
}

// relisted records what changed between the watch's last resourceVersion
// and a list at rv, and makes now the known objects.
func (h *History) relisted(t testing.TB, what string, last, rv uint64, known, now map[string]runtime.Object) {
	changed, gone := 0, 0
	seen := time.Now()
	for k, obj := range now {
		m, _ := meta.Accessor(obj)
		n, err := strconv.ParseUint(m.GetResourceVersion(), 10, 64)
		if err != nil || n <= last {
			continue
		}
		typ := watch.Modified
		if _, ok := known[k]; !ok {
			typ = watch.Added
		}
		h.add(Change{Type: typ, RV: n, Observed: seen, Obj: obj})
		changed++
	}
	for k, obj := range known {
		if _, ok := now[k]; !ok {
			h.add(Change{Type: watch.Deleted, RV: rv, Observed: seen, Obj: obj})
			gone++
		}
	}
	clear(known)
	for k, obj := range now {
		known[k] = obj
	}
	t.Logf("kubeletorder history: the API server refused to resume the watch of %s at RV %d; relisted at RV %d: %d objects changed in between (recorded as they were at the list), %d gone (recorded at RV %d)",
		what, last, rv, changed, gone, rv)
}

func (h *History) add(c Change) {
	h.mu.Lock()
	h.changes = append(h.changes, c)
	h.mu.Unlock()
}
