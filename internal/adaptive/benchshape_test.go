package adaptive

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"testing"
	"time"
)

// benchProfile is one backend workload of bench-peers: a burst of n
// attaches, all created at once and waited for, then n detaches, against
// the mock driver's profile (csimock.Profiles), whose phases count from
// the burst's start.
type benchProfile struct {
	name   string
	b      backend
	phases map[time.Duration]backend
	n      int
	// oracle is a limit fixed at the backend's own concurrency, for
	// comparison.
	oracle int
}

// benchProfiles are bench-peers' backend workloads at full size, in the
// order it runs them (bench.PeerSizesFor, bench.PeerBackendProfiles).
func benchProfiles() []benchProfile {
	throttling := backend{latency: 200 * time.Millisecond, spread: 0.25, capacity: 40, rate: 100, burst: 100}
	degraded := backend{latency: 200 * time.Millisecond, spread: 0.25, capacity: 10, rate: 25, burst: 25}
	return []benchProfile{
		{name: "slow-cloud", b: backend{latency: 2 * time.Second, spread: 0.3, capacity: 16, rate: 10, burst: 20}, n: 240, oracle: 16},
		{name: "fast-san", b: backend{latency: 20 * time.Millisecond, spread: 0.2, capacity: 64}, n: 600, oracle: 64},
		{name: "throttling-api", b: throttling, n: 1500, oracle: 20,
			phases: map[time.Duration]backend{20 * time.Second: degraded, 40 * time.Second: throttling}},
	}
}

// benchOps is what bench-peers counts as the backend's capacity at one
// moment (csimock's BackendStats.OpsPerSecond): capacity over the mean
// latency of the log-normal distribution, at most the request rate.
func benchOps(b backend) float64 {
	ops := float64(b.capacity) / (b.latency.Seconds() * math.Exp(b.spread*b.spread/2))
	if b.rate > 0 {
		ops = math.Min(ops, b.rate)
	}
	return ops
}

// benchRun is one profile's burst as bench-peers reports it.
type benchRun struct {
	// share is the operations served per second over the burst (first
	// create to last detach) as a share of the backend's capacity,
	// time-averaged over the same span; throttledShare the throttled
	// calls as a share of all calls.
	share, throttledShare float64
	served, throttled     int
	limits                []int
}

// retryAfter is how long a throttled VolumeAttachment waits before its
// next try in csi-attacher (executor.throttledRetryInterval): the limit's
// period, at least a second.
func retryAfter(c *Control) time.Duration { return max(time.Second, c.Period()) }

// benchBurst runs p's attach burst and then its detach burst from at on
// Control c (kept from the profiles before, as one csi-attacher process
// runs them all in bench-peers) and returns when it ended.
func benchBurst(seed uint64, c *Control, p benchProfile, at time.Time) (benchRun, time.Time) {
	s := newSim(seed, 11, c.cfg, p.b, maps.Clone(p.phases))
	s.c, s.start, s.now, s.filled = c, at, at, at
	var res benchRun
	for phase := range 2 {
		waiting, served := p.n, 0
		// retries are when each throttled call's VolumeAttachment is
		// tried again, in order.
		var retries []time.Time
		for served < p.n {
			for ; waiting > 0 && s.inFlight.Len() < s.c.Limit(); waiting-- {
				s.startCall()
			}
			if len(retries) > 0 && (s.inFlight.Len() == 0 || retries[0].Before(s.inFlight[0].at)) {
				s.now, retries, waiting = retries[0], retries[1:], waiting+1
				continue
			}
			outcome, ok := s.next()
			if !ok {
				continue
			}
			if outcome == Throttled {
				res.throttled++
				r := s.now.Add(retryAfter(s.c))
				i, _ := slices.BinarySearchFunc(retries, r, func(a, b time.Time) int { return a.Compare(b) })
				retries = slices.Insert(retries, i, r)
			} else {
				served++
				res.served++
			}
			res.limits = append(res.limits, s.c.Limit())
		}
		if phase == 0 {
			// bench-peers sees the last attach (it polls every 50 ms)
			// and deletes the VolumeAttachments.
			s.now = s.now.Add(100 * time.Millisecond)
		}
	}
	wall := s.now.Sub(at)
	// The capacity, sampled every 100 ms as bench-peers does.
	var sum float64
	var k int
	for off := time.Duration(0); off <= wall; off += 100 * time.Millisecond {
		b := p.b
		for _, start := range slices.Sorted(maps.Keys(p.phases)) {
			if off >= start {
				b = p.phases[start]
			}
		}
		sum += benchOps(b)
		k++
	}
	res.share = float64(res.served) / wall.Seconds() / (sum / float64(k))
	res.throttledShare = float64(res.throttled) / float64(res.served+res.throttled)
	return res, s.now
}

// benchLatencyWorkload stands for bench-peers' latency workloads, which
// a full run (make bench-peers) runs before the backend profiles with
// the same csi-attacher: 1,000 attaches and detaches against the mock's
// 20 ms calls, which the machine's load makes 40 ms, with room for
// every call. It takes the limit to its bound.
var benchLatencyWorkload = benchProfile{name: "saturated", b: backend{latency: 40 * time.Millisecond, spread: 0.3, capacity: 200}, n: 1000, oracle: 100}

// benchPeers runs bench-peers' backend workload with one Control: a
// canary call (a 20 ms attach), the latency workloads' burst when
// afterLatency (a full run; --workloads=backends leaves it out), then
// each profile's bursts in order, a few seconds apart.
func benchPeers(seed uint64, cfg Config, afterLatency bool) map[string]benchRun {
	c := NewControl(cfg)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c.Sample(now, Served, 20*time.Millisecond, 1)
	if afterLatency {
		_, now = benchBurst(seed, c, benchLatencyWorkload, now.Add(time.Second))
	}
	runs := map[string]benchRun{}
	for _, p := range benchProfiles() {
		now = now.Add(2 * time.Second)
		runs[p.name], now = benchBurst(seed, c, p, now)
	}
	return runs
}

// bench-peers' backend workload in simulation: one csi-attacher's limit
// through slow-cloud, fast-san and throttling-api's bursts of attaches
// then detaches, as bench-peers runs them at full size, over 12 seeds.
// Each order bench-peers runs them in: the backend profiles alone
// (--workloads=backends), and after the latency workloads (the default).
// Issue 39 asks ≥ 90 % of each backend's capacity with ≤ 2 % of the calls
// throttled (bench-peers reports the median of three rounds, so the
// simulation asks for a margin).
//   - throttling-api: every seed ≥ 93 % with ≤ 1.8 % throttled (1.64 %
//     at most since the restart after an idle moment). Before
//     the creep near a throttling point sped up, the limit climbed back
//     from 3–6 after the degraded phase at 5 % per judged period, and
//     five seeds of 12 served 83.7 to 89.9 %. Before a burst that starts
//     after an idle moment was capped and a much faster or slower burst
//     forgot the backend before it, seeds 6 and 7 throttled 1.74 and
//     1.86 % (95.3-100.4 %); now 93.9-101.5 % with 0.76-1.35 %.
//   - slow-cloud: the median must reach 90.5 % and stay within 5 points
//     of a limit fixed at the backend's 16 (the oracle: 92.0-97.4 %,
//     median 93.8 %; it loses the rest in each burst's last round, served
//     with fewer in flight, whose slowest call takes about 1.7 × the
//     median), every seed 90 % with at most 1.5 % of its calls throttled.
//     Before slow start went back to the answers' rate at its end and a
//     cut's queue was left to drain before the next judgement, slow start
//     overshot to 36-47, the median was 89.4 % and four seeds throttled
//     2.04-2.83 %. Before the burst-start cap and the stricter drain
//     after a throttled cut to the answers served, the median was 91.1 %,
//     the lowest seed 87.7 %, and seed 2 throttled 2.04 % (10 of 490
//     calls: the detach burst started 28 calls into a bucket of 20); now
//     the median is 92.1 %, the lowest 90.4 %, at most 1.23 % throttled.
//     After the latency workloads (a full make bench-peers), the burst
//     began with the limit at its bound of 100 into a bucket of 20, and
//     26.4-27.4 % of the calls were throttled (9.3 % in the bench); since a
//     burst after an idle moment with no request limit learned begins
//     with slow start from the initial limit, at most 1.03 % are, the
//     median 90.9 % (lowest 89.2 %); backends alone 92.0 % (89.2 %), at
//     most 1.23 % throttled. Every seed must serve 89 % with at most
//     1.5 % throttled.
//   - fast-san: bench-peers' API server bounds it, not the limit: none of
//     its calls throttled, and the limit's climb from slow-cloud's
//     reaches a median of 60 % (69.0 %; 34.2 % before a burst whose
//     answers are much faster than the baseline began slow start again:
//     with bursts 0.1-2 s apart, fast-san's was judged in slow-cloud's
//     3 s periods, and the limit grew from 8-30 at √limit per two 20 ms
//     periods).
func TestControlServesBenchPeersBackendBursts(t *testing.T) {
	for _, afterLatency := range []bool{false, true} {
		name := "backends alone"
		if afterLatency {
			name = "after the latency workloads"
		}
		t.Run(name, func(t *testing.T) { testBenchPeersBackendBursts(t, afterLatency) })
	}
}

func testBenchPeersBackendBursts(t *testing.T, afterLatency bool) {
	const seeds = 12
	shares, throttled := map[string][]float64{}, map[string][]float64{}
	var oracleShares []float64
	for seed := uint64(1); seed <= seeds; seed++ {
		runs := benchPeers(seed, DefaultConfig(100), afterLatency)
		var line string
		for _, p := range benchProfiles() {
			r := runs[p.name]
			shares[p.name] = append(shares[p.name], r.share)
			throttled[p.name] = append(throttled[p.name], r.throttledShare)
			line += fmt.Sprintf("  %s %.1f %% (%.2f %% throttled)", p.name, 100*r.share, 100*r.throttledShare)
		}
		p := benchProfiles()[0]
		oracle, _ := benchBurst(seed, NewControl(fixedAt(p.oracle)), p, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
		oracleShares = append(oracleShares, oracle.share)
		t.Logf("seed %d:%s; slow-cloud's oracle (16) %.1f %%", seed, line, 100*oracle.share)
		if r := runs["throttling-api"]; r.share < 0.93 || r.throttledShare > 0.018 {
			t.Errorf("seed %d: throttling-api: %.1f %% of capacity with %.2f %% of the calls throttled, want ≥ 93 %% with ≤ 1.8 %%", seed, 100*r.share, 100*r.throttledShare)
		}
		if r := runs["fast-san"]; r.throttled > 0 {
			t.Errorf("seed %d: fast-san (no request limit) throttled %d calls", seed, r.throttled)
		}
	}
	median := func(xs []float64) float64 {
		xs = slices.Clone(xs)
		slices.Sort(xs)
		return (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
	}
	for _, p := range benchProfiles() {
		t.Logf("%s: median %.1f %% of capacity (lowest %.1f %%), median %.2f %% throttled (highest %.2f %%)", p.name,
			100*median(shares[p.name]), 100*slices.Min(shares[p.name]), 100*median(throttled[p.name]), 100*slices.Max(throttled[p.name]))
	}
	t.Logf("slow-cloud's oracle: median %.1f %%", 100*median(oracleShares))
	if m, o := median(shares["slow-cloud"]), median(oracleShares); m < 0.905 || m < o-0.05 {
		t.Errorf("slow-cloud: median %.1f %% of capacity, want ≥ 90.5 %% and within 5 points of a limit fixed at 16 (%.1f %%)", 100*m, 100*o)
	}
	for i, x := range shares["slow-cloud"] {
		if x < 0.89 {
			t.Errorf("seed %d: slow-cloud: %.1f %% of capacity, want ≥ 89 %%", i+1, 100*x)
		}
	}
	for i, x := range throttled["slow-cloud"] {
		if x > 0.015 {
			t.Errorf("seed %d: slow-cloud: %.2f %% of the calls throttled, want ≤ 1.5 %%", i+1, 100*x)
		}
	}
	if m := median(shares["fast-san"]); m < 0.6 {
		t.Errorf("fast-san: median %.1f %% of capacity, want ≥ 60 %% (the limit climbing from slow-cloud's)", 100*m)
	}
}
