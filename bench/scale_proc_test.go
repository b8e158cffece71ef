package bench

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A milestone counts only after the one before it, and a line split
// across writes is matched once it is whole: kube-controller-manager logs
// "Caches are synced" for other informers before its attach/detach
// controller starts, and those must not count as the controller's.
func TestMilestonesMatchWholeLinesInOrderOnly(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := &milestoneWriter{file: f, seen: map[string]time.Time{}, milestones: []milestone{
		{"started", "Starting attach detach controller"}, {"synced", "Caches are synced"},
	}}
	for _, chunk := range []string{
		"I1 \"Caches are synced\" controller=\"RequestHeaderAuthRequestController\"\n",
		"I2 \"Starting attach ", "detach controller\"\nI3 \"Waiting for caches to sync\"\n",
	} {
		if _, err := w.Write([]byte(chunk)); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := w.seen["started"]; !ok {
		t.Fatal("the start line split over two writes was not matched")
	}
	if _, ok := w.seen["synced"]; ok {
		t.Fatal("a cache-sync line before the controller started counted as its sync")
	}
	if _, err := w.Write([]byte("I4 \"Caches are synced\"\n")); err != nil {
		t.Fatal(err)
	}
	if !w.seen["synced"].After(w.seen["started"]) && !w.seen["synced"].Equal(w.seen["started"]) {
		t.Fatalf("synced %v before started %v", w.seen["synced"], w.seen["started"])
	}
	if _, ok := w.seen["synced"]; !ok {
		t.Fatal("the controller's cache-sync line was not matched")
	}
}

// The collector's trace lines are summed: their CPU phases, and the
// collections that began well under their heap goal (periodic, or
// runtime.GC()); other lines do not count.
func TestGCTallySumsTraceLines(t *testing.T) {
	var g gcTally
	for _, line := range []string{
		"gc 1 @0.012s 2%: 0.026+0.39+0.042 ms clock, 0.21+0.25/0.38/0.49+0.33 ms cpu, 4->4->0 MB, 4 MB goal, 0 MB stacks, 0 MB globals, 8 P",
		`I1126 "gc 2 @1s looks like a trace line" ms clock, x ms cpu`,
		"gc 43 @388.243s 0%: 3.6+976+0.006 ms clock, 7.3+0/500/915+0.013 ms cpu, 805->805->694 MB, 1389 MB goal, 0 MB stacks, 0 MB globals, 2 P",
		"gc 9 @240.100s 0%: 0.05+410+0.02 ms clock, 0.1+0/380/25+0.04 ms cpu, 30->31->29 MB, 50 MB goal, 0 MB stacks, 0 MB globals, 2 P (forced)",
		"scvg: 1 MB released",
	} {
		g.add(line)
	}
	if g.Count != 3 || g.Periodic != 2 {
		t.Fatalf("count %d periodic %d, want 3 and 2", g.Count, g.Periodic)
	}
	want := (0.21 + 0.25 + 0.38 + 0.49 + 0.33 + 7.3 + 0 + 500 + 915 + 0.013 + 0.1 + 0 + 380 + 25 + 0.04) / 1000
	if d := g.CPUSeconds - want; d > 1e-9 || d < -1e-9 {
		t.Fatalf("CPU %.6f s, want %.6f", g.CPUSeconds, want)
	}
	if d := g.Sub(gcTally{Count: 1, CPUSeconds: want / 2}); d.Count != 2 || d.Periodic != 2 {
		t.Fatalf("Sub: %+v", d)
	}
}
