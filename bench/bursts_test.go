package bench

import (
	"errors"
	"testing"
)

func TestMedianOfTakesTheMiddleRunAndTheLowerMiddleOfAnEvenCount(t *testing.T) {
	type run struct{ rate float64 }
	key := func(r *run) float64 { return r.rate }
	runs := []*run{{91}, {68}, {104}}
	if got := medianOf(runs, key); got != runs[0] {
		t.Errorf("median of 91, 68, 104 = %v, want 91", got.rate)
	}
	if runs[0].rate != 91 || runs[1].rate != 68 {
		t.Errorf("medianOf reordered its input: %v, %v, %v", runs[0].rate, runs[1].rate, runs[2].rate)
	}
	if got := medianOf([]*run{{3}, {1}, {4}, {2}}, key); got.rate != 2 {
		t.Errorf("median of 3, 1, 4, 2 = %v, want the lower middle 2", got.rate)
	}
}

func TestEachOfAndMedianValueNameEveryBurstOnlyWhenThereAreSeveral(t *testing.T) {
	str := func(s string) string { return s }
	if got := eachOf([]string{"100"}, str); got != "100" {
		t.Errorf("one burst: %q", got)
	}
	if got, want := eachOf([]string{"100", "98", "100"}, str), "100, 98, 100 in the 3 bursts"; got != want {
		t.Errorf("three bursts: %q, want %q", got, want)
	}
	if got := medianValue([]string{"977 ms"}, "977 ms", str); got != "977 ms" {
		t.Errorf("one burst: %q", got)
	}
	if got, want := medianValue([]string{"977 ms", "1288 ms", "1229 ms"}, "1229 ms", str), "1229 ms, the median of 977 ms, 1288 ms, 1229 ms in the 3 bursts"; got != want {
		t.Errorf("three bursts: %q, want %q", got, want)
	}
}

func TestRunBurstsGivesEachBurstItsOwnIndicesAndStopsAtTheFirstFailureKeepingItsMeasurement(t *testing.T) {
	type run struct {
		first int
		phase string
	}
	var calls int
	boom := errors.New("every VolumeAttachment attached: timed out")
	runs, err := runBursts(3, 10, func(idx []int, name func(string) string) (*run, error) {
		calls++
		if len(idx) != 10 {
			t.Errorf("burst %d got %d indices, want 10", calls, len(idx))
		}
		r := &run{first: idx[0], phase: name("attach")}
		if calls == 2 {
			return r, boom
		}
		return r, nil
	})
	if !errors.Is(err, boom) || calls != 2 {
		t.Fatalf("runBursts = %v after %d bursts, want the second burst's error and no third burst", err, calls)
	}
	if len(runs) != 2 || runs[0].first != 0 || runs[1].first != 10 || runs[0].phase != "attach 1" || runs[1].phase != "attach 2" {
		t.Errorf("runs = %+v, %+v; want bursts on indices from 0 and 10, phases attach 1 and attach 2", runs[0], runs[1])
	}
	one, err := runBursts(1, 5, func(idx []int, name func(string) string) (*run, error) {
		return &run{first: idx[0], phase: name("attach")}, nil
	})
	if err != nil || len(one) != 1 || one[0].phase != "attach" {
		t.Errorf("a single burst: %+v, %v; want one phase named plainly attach", one, err)
	}
}
