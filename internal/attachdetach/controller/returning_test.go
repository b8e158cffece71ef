package controller

import (
	"slices"
	"testing"
)

func TestReturningNodes_theLastPodRecordedReleasesItsNodeOnce(t *testing.T) {
	r := newReturningNodes()
	r.start("node-a", []string{"ns/p1", "ns/p2"})
	r.start("node-b", nil) // no Pods: nothing to wait for
	if got := r.pending("node-b"); got != 0 {
		t.Fatalf("node-b pending %d, want 0", got)
	}
	if got := r.recorded("ns/p1", ""); got != nil {
		t.Fatalf("recorded(p1) = %q, want none (p2 still to record)", got)
	}
	if got := r.recorded("ns/other", ""); got != nil {
		t.Fatalf("recorded(other) = %q, want none: not a returning node's Pod", got)
	}
	if got := r.recorded("ns/p2", ""); !slices.Equal(got, []string{"node-a"}) {
		t.Fatalf("recorded(p2) = %q, want node-a: its last Pod", got)
	}
	if got := r.recorded("ns/p2", ""); got != nil {
		t.Fatalf("recorded(p2) again = %q, want none: node-a was released already", got)
	}
	if got := r.pending("node-a"); got != 0 {
		t.Fatalf("node-a pending %d after its Pods, want 0", got)
	}
}

func TestReturningNodes_deletedAgainOrReturningAgainStartsOver(t *testing.T) {
	r := newReturningNodes()
	r.start("node-a", []string{"ns/p1", "ns/p2"})
	r.forget("node-a") // deleted again
	if got := r.pending("node-a"); got != 0 {
		t.Fatalf("node-a pending %d after forget, want 0", got)
	}
	if got := r.recorded("ns/p1", ""); got != nil {
		t.Fatalf("recorded(p1) after forget = %q, want none", got)
	}
	r.start("node-a", []string{"ns/p1"})
	r.start("node-a", []string{"ns/p3"}) // came back once more: only p3 now
	if got := r.recorded("ns/p1", ""); got != nil {
		t.Fatalf("recorded(p1) = %q, want none: not on node-a's latest return", got)
	}
	// ns/p3 created again under its name on node-b, which came back too:
	// both nodes wait for it, and its pass releases both.
	r.start("node-b", []string{"ns/p3"})
	if got := r.recorded("ns/p3", ""); !slices.Equal(got, []string{"node-a", "node-b"}) {
		t.Fatalf("recorded(p3) = %q, want node-a and node-b", got)
	}
}

// A pass that could not record its Pod on its node (not managed when it
// looked) leaves that node waiting for the Pod; another node waiting for
// the same Pod key (the Pod deleted and created again elsewhere) is let go.
func TestReturningNodes_aPodNotRecordedKeepsItsNodeWaiting(t *testing.T) {
	r := newReturningNodes()
	r.start("node-a", []string{"ns/p1"})
	r.start("node-b", []string{"ns/p1"})
	if got := r.recorded("ns/p1", "node-a"); !slices.Equal(got, []string{"node-b"}) {
		t.Fatalf("recorded(p1, not on node-a) = %q, want node-b released", got)
	}
	if got := r.pending("node-a"); got != 1 {
		t.Fatalf("node-a pending %d, want 1: p1 was not recorded there", got)
	}
	if got := r.recorded("ns/p1", ""); !slices.Equal(got, []string{"node-a"}) {
		t.Fatalf("recorded(p1) = %q, want node-a released", got)
	}
}
