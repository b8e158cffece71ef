package kube

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A SIGTERM cancels the process's context while the workers still drain
// and before the leader elector records "stopped leading": events recorded
// then, and right before Stop, all reach the sink, and the flush marker does
// not.
func TestEvents_recordedAfterTheContextIsDoneAndRightBeforeStop_allReachTheSink(t *testing.T) {
	fake := newFakeEventSink()
	ctx, cancel := context.WithCancel(t.Context())
	ev := startEvents(ctx, fake, 4)
	rec := ev.NewRecorder(v1.EventSource{Component: "test"})
	cancel() // SIGTERM
	const n = 50
	var want []string
	for i := range n {
		pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("pod-%d", i), UID: "u"}}
		rec.Event(pod, v1.EventTypeNormal, "SuccessfulAttachVolume", "attached")
		want = append(want, pod.Name)
	}
	ev.Stop()
	created, inFlight, _ := fake.snapshot()
	if inFlight != 0 {
		t.Errorf("%d creates still in flight after Stop", inFlight)
	}
	// The recorder names an event <object>.<unique suffix>.
	var got []string
	for _, name := range created {
		got = append(got, name[:strings.LastIndex(name, ".")])
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("events created for %d Pods %v, want all %d", len(got), got, n)
	}
	ev.Stop() // idempotent
}
