package attacher

import (
	"fmt"
	"slices"
	"testing"

	"github.com/latchcsi/latch/internal/attacher/decide"
)

// An attach pass is decided against the pending publications of its own
// volume only: orphans not yet unpublished, suspects and publishes in
// flight of that handle, each kind by VolumeAttachment name, as before;
// another volume's never reach it, and a pass that resolves no volume gets
// none.
func TestLedgerDecideHandsOnlyTheVolumesPendingPublications(t *testing.T) {
	l := newLedger()
	l.orphans["va-b"] = orphan{name: "va-b", handle: "vol-1", nodeID: "n2"}
	l.orphans["va-a"] = orphan{name: "va-a", handle: "vol-1", nodeID: "n3"}
	l.orphans["va-done"] = orphan{name: "va-done", handle: "vol-1", nodeID: "n4", unpublished: true}
	l.orphans["va-x"] = orphan{name: "va-x", handle: "vol-2", nodeID: "n2"}
	l.suspects["va-s"] = orphan{name: "va-s", handle: "vol-1", nodeID: "n5"}
	l.suspects["va-y"] = orphan{name: "va-y", handle: "vol-2", nodeID: "n5"}
	l.publishing["va-p"] = orphan{name: "va-p", handle: "vol-1", nodeID: "n6"}
	for i := range 100 {
		n := fmt.Sprintf("va-other-%d", i)
		l.publishing[n] = orphan{name: n, handle: fmt.Sprintf("vol-o%d", i), nodeID: "n1"}
	}
	var got []decide.Orphan
	l.decide("vol-1", true, func(pending []decide.Orphan) (decide.AttachPlan, *orphan) {
		got = pending
		return decide.AttachPlan{}, nil
	})
	var names []string
	for _, o := range got {
		names = append(names, fmt.Sprintf("%s/%s suspect=%v publishing=%v", o.VA, o.Handle, o.Suspect, o.Publishing))
	}
	want := []string{
		"va-a/vol-1 suspect=false publishing=false",
		"va-b/vol-1 suspect=false publishing=false",
		"va-s/vol-1 suspect=true publishing=false",
		"va-p/vol-1 suspect=false publishing=true",
	}
	if !slices.Equal(names, want) {
		t.Errorf("decide saw %q, want %q", names, want)
	}
	got = []decide.Orphan{{}}
	l.decide("", false, func(pending []decide.Orphan) (decide.AttachPlan, *orphan) {
		got = pending
		return decide.AttachPlan{}, nil
	})
	if len(got) != 0 {
		t.Errorf("a pass that resolves no volume saw %d pending publications, want none", len(got))
	}
	if all := l.pending(); len(all) != 106 {
		t.Errorf("pending() = %d publications, want all 106 not yet unpublished", len(all))
	}
}

// An attach pass's critical section with 100 publishes of other volumes in
// flight (--worker-threads' default): it used to copy and sort all of them
// (about 46 µs and 44 kB a pass on the 2-core machine).
func BenchmarkLedgerDecide(b *testing.B) {
	l := newLedger()
	for i := range 100 {
		n := fmt.Sprintf("csi-%064d", i)
		l.publishing[n] = orphan{name: n, handle: fmt.Sprintf("vol-%d", i), nodeID: "node-1", nodeName: "node-1"}
	}
	b.ReportAllocs()
	for b.Loop() {
		l.decide("vol-new", true, func([]decide.Orphan) (decide.AttachPlan, *orphan) { return decide.AttachPlan{}, nil })
	}
}
