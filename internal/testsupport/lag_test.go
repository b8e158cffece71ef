package testsupport

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// A create is matched by the name of the object it sends (its path names
// none), in JSON and in protobuf; the write reaches the server and the
// client gets the chosen reason. Fired counts it.
func TestAPITransportFailAfterWriteWithMatchesACreateByTheNameItSends(t *testing.T) {
	for _, contentType := range []string{"application/json", "application/vnd.kubernetes.protobuf"} {
		t.Run(contentType, func(t *testing.T) {
			s, reached := server(t)
			tr := NewAPITransport()
			c := clientSending(t, s, tr, contentType)
			r := tr.FailAfterWriteWith(Match{Method: "create", Resource: "volumeattachments", Name: "target"}, 1,
				http.StatusConflict, metav1.StatusReasonAlreadyExists, `volumeattachments.storage.k8s.io "target" already exists`)
			ctx := context.Background()
			// Only the first create of "target" fails.
			for i, name := range []string{"other", "target", "target"} {
				_, err := c.StorageV1().VolumeAttachments().Create(ctx, &storagev1.VolumeAttachment{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
				switch {
				case i == 1 && !apierrors.IsAlreadyExists(err):
					t.Errorf("create %d of %s: %v, want AlreadyExists", i, name, err)
				case i != 1 && err != nil:
					t.Errorf("create %d of %s: %v", i, name, err)
				}
			}
			if got := reached.Load(); got != 3 {
				t.Errorf("%d creates reached the server, want 3 (the failed one too)", got)
			}
			if got := tr.Fired(r); got != 1 {
				t.Errorf("Fired = %d, want 1", got)
			}
			if w := tr.Writes(); len(w) != 3 || w[1].Code != http.StatusCreated || w[1].Injected {
				t.Errorf("writes = %+v, want the second recorded with the server's 201", w)
			}
		})
	}
}

// While a LagWatches rule is in place the watch delivers nothing; once it
// is removed, every event that arrived meanwhile is delivered, in order.
// A watch of another resource does not lag.
func TestAPITransportLagWatchesHoldsEventsBackAndLosesNone(t *testing.T) {
	tr := NewAPITransport()
	r := tr.LagWatches(Match{Resource: "volumeattachments"})
	if other := tr.lagging(parsePath("/api/v1/pods")); other {
		t.Error("a watch of pods lags under a rule for volumeattachments")
	}
	events, w := watchThrough(t, tr)
	events <- "a"
	events <- "b"
	select {
	case ev := <-w.ResultChan():
		t.Fatalf("event %v delivered while the watch lags", ev)
	case <-time.After(200 * time.Millisecond):
	}
	tr.Remove(r)
	for _, want := range []string{"a", "b"} {
		select {
		case ev := <-w.ResultChan():
			if va, ok := ev.Object.(*storagev1.VolumeAttachment); ev.Type != watch.Added || !ok || va.Name != want {
				t.Errorf("event %v %v, want ADDED %s", ev.Type, ev.Object, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("event %s not delivered after the lag ended", want)
		}
	}
}

// A watch opened before a Partition delivers what came before the cut and
// nothing after it: the stream ends, as a cut connection's does.
func TestAPITransportPartitionEndsAnOpenWatch(t *testing.T) {
	tr := NewAPITransport()
	events, w := watchThrough(t, tr)
	events <- "before"
	select {
	case ev := <-w.ResultChan():
		if va, ok := ev.Object.(*storagev1.VolumeAttachment); !ok || va.Name != "before" {
			t.Fatalf("event %v %v, want ADDED before", ev.Type, ev.Object)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the event before the partition was not delivered")
	}
	tr.Partition()
	events <- "after"
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				return // the stream ended, "after" undelivered
			}
			if va, isVA := ev.Object.(*storagev1.VolumeAttachment); isVA && va.Name == "after" {
				t.Fatalf("event %s delivered through a partition", va.Name)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the watch did not end after the partition")
		}
	}
}

// watchThrough opens a watch of VolumeAttachments through tr on a
// watchServer; each name sent on events arrives as an ADDED event.
func watchThrough(t *testing.T, tr *APITransport) (chan<- string, watch.Interface) {
	events := make(chan string, 10)
	c := client(t, watchServer(t, events), tr)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w, err := c.StorageV1().VolumeAttachments().Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	return events, w
}

// watchServer answers every request with a watch stream of
// VolumeAttachments, one ADDED event for each name sent on events.
func watchServer(t *testing.T, events <-chan string) *httptest.Server {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		for {
			select {
			case name := <-events:
				fmt.Fprintf(w, `{"type":"ADDED","object":{"kind":"VolumeAttachment","apiVersion":"storage.k8s.io/v1","metadata":{"name":%q}}}`+"\n", name)
				w.(http.Flusher).Flush()
			case <-r.Context().Done():
				return
			}
		}
	}))
	t.Cleanup(s.Close)
	return s
}
