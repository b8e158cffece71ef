package bench

import (
	"regexp"
	"strconv"
	"strings"
)

// gcTrace is one line of the Go runtime's collection trace, which every
// child process prints to stderr (GODEBUG=gctrace=1):
//
//	gc 7 @120.5s 0%: 0.02+310+0.01 ms clock, 0.05+0/290/20+0.02 ms cpu, 700->701->690 MB, 1380 MB goal, ...
type gcTrace struct {
	// cpuSeconds is the sum of the "ms cpu" phases (stop-the-world,
	// assist, background, idle marking, stop-the-world); idle marking
	// runs on otherwise idle cores and counts in the process's CPU time
	// too.
	cpuSeconds float64
	// startMB and liveMB are the heap when the collection began and the
	// live heap it marked (hasHeap: the line has them); goalMB is the heap
	// goal (hasGoal).
	startMB, liveMB, goalMB uint64
	hasHeap, hasGoal        bool
	// forced: runtime.GC() started it.
	forced bool
}

// gcLine matches gctrace's "A->B->C MB" (heap at GC start, at GC end, live
// heap marked).
var gcLine = regexp.MustCompile(`(\d+)->(\d+)->(\d+) MB`)

// gcGoal matches gctrace's "N MB goal".
var gcGoal = regexp.MustCompile(`(\d+) MB goal`)

// parseGCTrace reads line as a collection trace line; false when it is
// not one.
func parseGCTrace(line string) (gcTrace, bool) {
	if !strings.HasPrefix(line, "gc ") {
		return gcTrace{}, false
	}
	_, rest, ok := strings.Cut(line, " ms clock, ")
	if !ok {
		return gcTrace{}, false
	}
	phases, _, ok := strings.Cut(rest, " ms cpu")
	if !ok {
		return gcTrace{}, false
	}
	var g gcTrace
	for _, f := range strings.FieldsFunc(phases, func(r rune) bool { return r == '+' || r == '/' }) {
		v, err := strconv.ParseFloat(f, 64)
		if err != nil {
			return gcTrace{}, false
		}
		g.cpuSeconds += v / 1000
	}
	if m := gcLine.FindStringSubmatch(line); m != nil {
		g.startMB, _ = strconv.ParseUint(m[1], 10, 64)
		g.liveMB, _ = strconv.ParseUint(m[3], 10, 64)
		g.hasHeap = true
	}
	if m := gcGoal.FindStringSubmatch(line); m != nil {
		g.goalMB, _ = strconv.ParseUint(m[1], 10, 64)
		g.hasGoal = true
	}
	g.forced = strings.HasSuffix(line, "(forced)")
	return g, true
}
