package testsupport

import "testing"

func TestSyncBufferKeepsAllOrTheLastMaxBytes(t *testing.T) {
	var all SyncBuffer
	tail := SyncBuffer{Max: 5}
	for _, w := range []string{"abc", "defg", "hi"} {
		for _, b := range []*SyncBuffer{&all, &tail} {
			if n, err := b.Write([]byte(w)); n != len(w) || err != nil {
				t.Fatalf("Write(%q) = %d, %v", w, n, err)
			}
		}
	}
	if got := all.String(); got != "abcdefghi" {
		t.Errorf("unbounded buffer = %q, want every byte", got)
	}
	if got := tail.String(); got != "efghi" {
		t.Errorf("Max 5 buffer = %q, want the last 5 bytes", got)
	}
}
