package bench

import (
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strings"
	"time"
)

const rowFormat = "%-14s %6s %8s %8s %7s %8s %8s %6s %6s %7s %6s %7s %7s %7s\n"

func printHeader(w io.Writer) {
	fmt.Fprintf(w, rowFormat, "scenario", "ops", "wall s", "ops/s", "%limit", "p50 ms", "p99 ms", "CSI", "VA/op", "VAst/op", "PV/op", "wr/op", "CPU s", "RSS MB")
}

func printResult(w io.Writer, r *Result) {
	for _, p := range r.Phases {
		cpu, rss := "-", "-"
		if len(p.CPUSeconds) > 0 {
			var sum float64
			for _, v := range p.CPUSeconds {
				sum += v
			}
			cpu = fmt.Sprintf("%.2f", sum)
		}
		if len(p.PeakRSSBytes) > 0 {
			var peak uint64
			for _, v := range p.PeakRSSBytes {
				peak = max(peak, v)
			}
			rss = fmt.Sprintf("%.0f", float64(peak)/(1<<20))
		}
		pct := "-"
		if p.PercentOfLimit > 0 {
			pct = fmt.Sprintf("%.0f%%", p.PercentOfLimit)
		}
		fmt.Fprintf(w, rowFormat, r.Scenario+" "+p.Name, fmt.Sprint(p.Ops),
			fmt.Sprintf("%.2f", p.WallSeconds), fmt.Sprintf("%.0f", p.PerSecond), pct,
			msOrDash(p.P50Ms), msOrDash(p.P99Ms), fmt.Sprint(p.CSICalls),
			fmt.Sprintf("%.2f", p.VAWritesPerOp), fmt.Sprintf("%.2f", p.VAStatusPerOp),
			fmt.Sprintf("%.2f", p.PVWritesPerOp), fmt.Sprintf("%.2f", p.WritesPerOp), cpu, rss)
	}
	if len(r.Figures) > 0 {
		keys := make([]string, 0, len(r.Figures))
		for k := range r.Figures {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		parts := make([]string, 0, len(keys))
		for _, k := range keys {
			parts = append(parts, fmt.Sprintf("%s=%s", k, trimFloat(r.Figures[k])))
		}
		fmt.Fprintf(w, "    %s %s: %s\n", r.Scenario, r.Title, strings.Join(parts, " "))
	}
	if r.Error != "" {
		fmt.Fprintf(w, "    ERROR %s: %s\n", r.Scenario, r.Error)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "    NOTE %s: %s\n", r.Scenario, n)
	}
	for _, c := range r.Checks {
		verdict := "PASS"
		if !c.Pass {
			verdict = "FAIL"
		}
		fmt.Fprintf(w, "    %s %s %s: %s (target %s)\n", verdict, r.Scenario, c.Name, c.Value, c.Target)
	}
}

func msOrDash(ms float64) string {
	if ms == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", ms)
}

func trimFloat(v float64) string {
	if v == float64(int64(v)) {
		return fmt.Sprint(int64(v))
	}
	if math.Abs(v) >= 100 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.3g", v)
}

// percentiles returns the p50 and p99 of ds in milliseconds.
func percentiles(ds []time.Duration) (p50, p99 float64) {
	if len(ds) == 0 {
		return 0, 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(q float64) float64 {
		i := int(q*float64(len(s))+0.5) - 1
		i = max(0, min(i, len(s)-1))
		return float64(s[i]) / float64(time.Millisecond)
	}
	return at(0.50), at(0.99)
}

// setWrites fills a phase's write figures from the components' writes.
func (p *Phase) setWrites(w Writes, ops int) {
	p.Writes = w
	if ops == 0 {
		return
	}
	n := float64(ops)
	p.VAWritesPerOp = float64(w.Resource("volumeattachments")) / n
	p.VAStatusPerOp = float64(w.Resource("volumeattachments/status")) / n
	p.PVWritesPerOp = float64(w.Resource("persistentvolumes")) / n
	p.WritesPerOp = float64(w.Total()) / n
}

// setLimit compares the phase's rate with F's limit: F's writes/s divided
// by the phase's writes per operation.
func (p *Phase) setLimit(limitWritesPerSecond float64) {
	if limitWritesPerSecond <= 0 || p.WritesPerOp <= 0 {
		return
	}
	p.PercentOfLimit = 100 * p.PerSecond / (limitWritesPerSecond / p.WritesPerOp)
}
