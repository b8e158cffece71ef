package main

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"
)

const mib = 1 << 20

func TestGCFloorPercentFor_goalReachesTheFloorOnlyForSmallHeaps(t *testing.T) {
	f := &gcFloor{minHeap: 32 * mib, base: 100}
	for _, tc := range []struct {
		name                  string
		live, stacks, globals uint64
		want                  int
	}{
		// 11 MiB live, 1 MiB of stacks and globals: 21 MiB more make 32.
		{"small heap: goal at the floor", 11 * mib, 512 << 10, 512 << 10, 175},
		{"heap at half the floor: base already reaches it", 16 * mib, 0, 0, 100},
		{"heap above the floor: base", 80 * mib, mib, mib, 100},
		{"heap at the floor: base", 32 * mib, 0, 0, 100},
		{"nothing marked yet: base", 0, 0, 0, 100},
		// At start: 1.5 MiB live would need 2,000 %, and the workers'
		// stacks started next would multiply by that too.
		{"tiny heap at start: at most 400", 3 * mib / 2, 0, 512 << 10, 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := f.percentFor(tc.live, tc.stacks, tc.globals)
			if got != tc.want {
				t.Errorf("percentFor(%d, %d, %d) = %d, want %d", tc.live, tc.stacks, tc.globals, got, tc.want)
			}
			// Go's goal for that percentage is never below the floor
			// (nor, for base, below Go's own goal).
			goal := tc.live + (tc.live+tc.stacks+tc.globals)*uint64(got)/100
			if tc.live > 0 && goal < f.minHeap && got != f.base && got != maxGCFloorPercent {
				t.Errorf("goal %d bytes below the floor %d", goal, f.minHeap)
			}
		})
	}
}

func TestGCFloorPercentFor_keepsAHigherBase(t *testing.T) {
	f := &gcFloor{minHeap: 32 * mib, base: 400}
	if got := f.percentFor(11*mib, 0, 0); got != 400 {
		t.Errorf("percentFor with GOGC 400 = %d, want 400 (its goal, 55 MiB, is above the floor)", got)
	}
}

func TestGCFloorAdjust_setsOnlyChanges(t *testing.T) {
	var sets []int
	live := uint64(8 * mib)
	f := &gcFloor{minHeap: 32 * mib, base: 100, last: 100,
		setPercent: func(p int) int { sets = append(sets, p); return 0 },
		read:       func() (uint64, uint64, uint64) { return live, 0, 0 },
	}
	f.adjust()
	f.adjust()
	live = 64 * mib
	f.adjust()
	if want := []int{300, 100}; len(sets) != len(want) || sets[0] != want[0] || sets[1] != want[1] {
		t.Errorf("SetGCPercent calls %v, want %v (8 MiB live: 300; unchanged: none; 64 MiB: back to base)", sets, want)
	}
}

func TestGCFloorFor_GOGCEnvironmentAndZeroTurnItOff(t *testing.T) {
	for _, tc := range []struct {
		env       string
		mib       int
		wantBytes uint64
		wantFrom  string
	}{
		{"", 32, 32 * mib, "--gc-min-heap-mib"},
		{"", 0, 0, "--gc-min-heap-mib=0"},
		{"100", 32, 0, "GOGC environment variable"},
		{"off", 64, 0, "GOGC environment variable"},
	} {
		got, from := gcFloorFor(tc.env, tc.mib)
		if got != tc.wantBytes || from != tc.wantFrom {
			t.Errorf("gcFloorFor(%q, %d) = %d, %q; want %d, %q", tc.env, tc.mib, got, from, tc.wantBytes, tc.wantFrom)
		}
	}
}

func TestParseOptions_gcMinHeapDefaultAndRejectsNegative(t *testing.T) {
	o, err := parseOptions(nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.gcMinHeapMiB != 0 {
		t.Errorf("gc-min-heap-mib = %d, want 0 (off: Go's own pace)", o.gcMinHeapMiB)
	}
	if _, err := parseOptions([]string{"--gc-min-heap-mib=-1"}); err == nil {
		t.Error("--gc-min-heap-mib=-1 accepted, want an error naming the flag")
	}
}

// TestStartGCFloor_followsEveryCollection runs the floor on this test
// process's own collector: after a collection with a small live heap the
// percentage is raised, after one with a live heap above the floor it is
// back at the base.
func TestStartGCFloor_followsEveryCollection(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	f := startGCFloor(256 * mib)
	defer f.stopped.Store(true)
	percent := func() int {
		s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
		metrics.Read(s)
		return int(s[0].Value.Uint64())
	}
	waitFor := func(what string, ok func(p int) bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			runtime.GC()
			if p := percent(); ok(p) {
				return
			} else if time.Now().After(deadline) {
				t.Fatalf("%s: GOGC percentage %d", what, p)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor("small live heap: percentage raised above 100", func(p int) bool { return p > 100 })
	big := make([][]byte, 300)
	for i := range big {
		big[i] = make([]byte, mib)
	}
	waitFor("300 MiB live: back at 100", func(p int) bool { return p == 100 })
	runtime.KeepAlive(big)
	big = nil
	waitFor("small again: raised again", func(p int) bool { return p > 100 })
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.base != 100 {
		t.Errorf("base %d, want 100 (GOGC not set)", f.base)
	}
}
