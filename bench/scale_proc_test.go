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
