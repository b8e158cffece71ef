package attacher

import "testing"

func TestDefaultAPIWorkers_twoHundredOrTwoPerCSISlot(t *testing.T) {
	for _, c := range []struct{ workers, want int }{{1, 200}, {10, 200}, {100, 200}, {101, 202}, {500, 1000}} {
		if got := DefaultAPIWorkers(c.workers); got != c.want {
			t.Errorf("DefaultAPIWorkers(%d) = %d, want %d", c.workers, got, c.want)
		}
	}
}
