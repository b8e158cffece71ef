package main

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
)

// DefaultGCMinHeapMiB is --gc-min-heap-mib's default: off, Go's own pace.
// The sidecar's live heap is small (its caches, about 11 MB in the attach
// burst benchmark) while every API write and watch event allocates, so at
// Go's default (GOGC=100: collect when the heap has doubled) it collects
// every 10 MB or so, and the collector's marking takes about a third of
// its CPU in an attach burst. A floor of 32 MiB saved 7-17 % of that CPU
// in bench-peers and raised the peak RSS by 13-15 MB, above latch
// v0.1.0's; every driver Pod pays the memory, only bursts gain the CPU, so
// the floor is the operator's choice (docs/performance.md, "csi-attacher's
// CPU per attach").
const DefaultGCMinHeapMiB = 0

// gcFloor keeps the collector's heap goal at least minHeap bytes: after
// every collection it sets the GOGC percentage that puts the goal at
// minHeap for the live heap just marked, or leaves base (the percentage
// in force at start, 100 unless GOGC says otherwise) when that already
// does. Go's own goal is live + (live + stacks + globals) × GOGC/100; the
// percentage is computed on the same terms.
type gcFloor struct {
	minHeap uint64
	base    int
	// setPercent is debug.SetGCPercent; read gives the live heap, the
	// goroutine stacks and the globals the last collection scanned (tests
	// replace both).
	setPercent func(int) int
	read       func() (live, stacks, globals uint64)

	mu   sync.Mutex
	last int
	// stopped ends the re-arming (tests; the binary keeps it for its
	// life).
	stopped atomic.Bool
}

// percentFor is the GOGC percentage that makes the heap goal at least
// f.minHeap for a live heap of live bytes with stacks and globals: base
// when its goal is already as large.
func (f *gcFloor) percentFor(live, stacks, globals uint64) int {
	scanned := live + stacks + globals
	if scanned == 0 || live >= f.minHeap {
		return f.base
	}
	// Rounded up, so that the goal is never below the floor.
	p := (f.minHeap - live) * 100
	p = (p + scanned - 1) / scanned
	// Go's goal counts the goroutine stacks as they are when it is
	// computed, not as the last collection found them: a percentage made
	// for a live heap of a megabyte or two (at start) would let the
	// stacks of the workers started next push the goal far past the
	// floor.
	p = min(p, maxGCFloorPercent)
	return max(int(p), f.base)
}

// maxGCFloorPercent is the highest percentage the floor sets: the goal
// reaches the floor for live heaps from about a fifth of it up (with the
// 32 MiB default, from about 6 MiB), and a small heap at start plus its
// workers' stacks cannot raise it beyond five times what it scans.
const maxGCFloorPercent = 400

// adjust sets the percentage for the last collection's live heap, when it
// differs from the one set before, and returns it.
func (f *gcFloor) adjust() int {
	if f.stopped.Load() {
		// Stopped (tests): a collection's cleanup still pending sets
		// nothing.
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.last
	}
	live, stacks, globals := f.read()
	if live == 0 {
		// Before the first collection Go's goal is its 4 MiB minimum:
		// aim the first one at the floor as if that were live.
		live = 4 << 20
	}
	p := f.percentFor(live, stacks, globals)
	f.mu.Lock()
	defer f.mu.Unlock()
	if p != f.last {
		f.setPercent(p)
		f.last = p
	}
	return p
}

// gcSentinel is an object made only to be collected: its cleanup runs
// once after each collection. It holds a pointer so that the allocator
// never batches it with other small objects (which could delay its
// cleanup indefinitely).
type gcSentinel struct{ _ *byte }

// arm makes adjust run after the next collection, and again after every
// one that follows, for the life of the process.
func (f *gcFloor) arm() {
	if f.stopped.Load() {
		return
	}
	s := &gcSentinel{}
	runtime.AddCleanup(s, func(f *gcFloor) {
		f.adjust()
		f.arm()
	}, f)
}

// gcFloorFor decides whether the sidecar raises the collector's minimum
// heap: not when GOGC is set (the operator chose the collector's pace,
// and Go applied it) or minHeapMiB is 0. It returns the floor in bytes (0:
// none) and why, for the log.
func gcFloorFor(gogcEnv string, minHeapMiB int) (uint64, string) {
	switch {
	case gogcEnv != "":
		return 0, "GOGC environment variable"
	case minHeapMiB <= 0:
		return 0, "--gc-min-heap-mib=0"
	}
	return uint64(minHeapMiB) << 20, "--gc-min-heap-mib"
}

// startGCFloor installs a floor of minHeap bytes on the process's
// collector, from Go's current percentage (100 when GOGC is not set), and
// returns it; the first goal is set at once.
func startGCFloor(minHeap uint64) *gcFloor {
	base := debug.SetGCPercent(100)
	debug.SetGCPercent(base)
	f := &gcFloor{minHeap: minHeap, base: base, setPercent: debug.SetGCPercent, read: readGCHeap, last: base}
	f.adjust()
	f.arm()
	return f
}

var gcHeapMetrics = []string{"/gc/heap/live:bytes", "/gc/scan/stack:bytes", "/gc/scan/globals:bytes"}

// readGCHeap reads what the last collection marked: the live heap, the
// goroutine stacks and the globals.
func readGCHeap() (live, stacks, globals uint64) {
	s := make([]metrics.Sample, len(gcHeapMetrics))
	for i, name := range gcHeapMetrics {
		s[i].Name = name
	}
	metrics.Read(s)
	v := func(i int) uint64 {
		if s[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return s[i].Value.Uint64()
	}
	return v(0), v(1), v(2)
}
