package kubeletorder

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
)

func pod(name, rv string, phase v1.PodPhase) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, ResourceVersion: rv}, Status: v1.PodStatus{Phase: phase}}
}

// A watch whose connection broke mid-stream (client-go reports it as an
// error event, as on an API server restart) is resumed from the last
// resourceVersion it delivered, and what follows is recorded: the
// history has no hole and the test does not fail.
func TestFollow_resumesAWatchThatEndedWithAnErrorEventFromItsLastResourceVersion(t *testing.T) {
	var (
		mu    sync.Mutex
		asked []string
	)
	first, second := watch.NewFakeWithChanSize(4, false), watch.NewFakeWithChanSize(4, false)
	s := source{
		what: "pods",
		list: func() (runtime.Object, error) {
			t.Error("listed: a resumable watch must not relist")
			return &v1.PodList{}, nil
		},
		watch: func(rv string) (watch.Interface, error) {
			mu.Lock()
			defer mu.Unlock()
			asked = append(asked, rv)
			return second, nil
		},
	}
	h := &History{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.follow(ctx, t, s, first, 3, map[string]runtime.Object{})
	}()
	first.Add(pod("p", "5", v1.PodPending))
	broken := apierrors.NewInternalError(errors.New("unable to decode an event from the watch stream: http2: client connection force closed via ClientConn.Close"))
	first.Error(&broken.ErrStatus)
	second.Modify(pod("p", "7", v1.PodRunning))
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, ok := h.First(PodNamed("p", func(p *v1.Pod) bool { return p.Status.Phase == v1.PodRunning })); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the change after the broken watch was not recorded")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	second.Stop()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if len(asked) != 1 || asked[0] != "5" {
		t.Errorf("watched again from %q, want once from the last delivered resourceVersion 5", asked)
	}
	if c, ok := h.First(PodNamed("p", func(*v1.Pod) bool { return true })); !ok || c.RV != 5 || c.Type != watch.Added {
		t.Errorf("first recorded change = %v, want the ADDED at RV 5", c)
	}
}
