package adaptive

import (
	"container/heap"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// backend is a simulated storage backend with the mock driver's model
// (docs/csi-mock-driver.md, "Backend model"): a log-normal latency with
// median latency, capacity calls at once before latency grows with the
// load, and a token-bucket request limit.
type backend struct {
	latency  time.Duration
	spread   float64
	capacity int
	rate     float64 // calls per second; 0: none
	burst    float64
}

// opsPerSecond is what the backend can serve.
func (b backend) opsPerSecond() float64 {
	ops := float64(b.capacity) / b.latency.Seconds()
	if b.rate > 0 {
		ops = math.Min(ops, b.rate)
	}
	return ops
}

type endEvent struct {
	at        time.Time
	start     time.Time
	throttled bool
	// release frees a throttled call's slot (the Limiter keeps it for a
	// period after the answer).
	release bool
}

type events []endEvent

func (e events) Len() int           { return len(e) }
func (e events) Less(i, j int) bool { return e[i].at.Before(e[j].at) }
func (e events) Swap(i, j int)      { e[i], e[j] = e[j], e[i] }
func (e *events) Push(x any)        { *e = append(*e, x.(endEvent)) }
func (e *events) Pop() any          { old := *e; x := old[len(old)-1]; *e = old[:len(old)-1]; return x }

type simResult struct {
	// throughput is the share of the backend's capacity served over the
	// second half of the run; throttledShare the share of calls
	// throttled over it.
	throughput, throttledShare float64
	limits                     []int // the limit at each tenth of the run
	finalLimit                 int
}

// sim is the event loop both simulations share: calls started under
// Control's limit against a backend, their answers in the order they end.
type sim struct {
	rng      *rand.Rand
	c        *Control
	b        backend
	phases   map[time.Duration]backend
	start    time.Time
	now      time.Time
	inFlight events
	// The request limit's token bucket.
	tokens float64
	filled time.Time
}

func newSim(seed, stream uint64, cfg Config, b backend, phases map[time.Duration]backend) *sim {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	return &sim{rng: rand.New(rand.NewPCG(seed, stream)), c: NewControl(cfg), b: b, phases: phases,
		start: start, now: start, tokens: b.burst, filled: start}
}

// elapsed is the simulated time since the start.
func (s *sim) elapsed() time.Duration { return s.now.Sub(s.start) }

// startCall starts one call now: throttled at once (a round trip of 1 ms)
// when the bucket is empty, else served after a log-normal latency that
// grows with the calls beyond the backend's capacity.
func (s *sim) startCall() {
	for off, nb := range s.phases {
		if s.elapsed() >= off {
			s.b = nb
			s.tokens = math.Min(s.tokens, nb.burst)
			delete(s.phases, off)
		}
	}
	if s.b.rate > 0 {
		s.tokens = math.Min(s.b.burst, s.tokens+s.now.Sub(s.filled).Seconds()*s.b.rate)
		s.filled = s.now
		if s.tokens < 1 {
			heap.Push(&s.inFlight, endEvent{at: s.now.Add(time.Millisecond), start: s.now, throttled: true})
			return
		}
		s.tokens--
	}
	running := s.inFlight.Len() + 1
	lat := float64(s.b.latency) * math.Exp(s.b.spread*s.rng.NormFloat64())
	if running > s.b.capacity {
		lat *= float64(running) / float64(s.b.capacity)
	}
	heap.Push(&s.inFlight, endEvent{at: s.now.Add(time.Duration(lat)), start: s.now})
}

// next moves to the next event: a call's answer, handed to Control (a
// throttled call keeps its slot for a period, as the Limiter does), whose
// outcome it returns; or the end of a throttled call's period, which frees
// its slot (ok false).
func (s *sim) next() (outcome Outcome, ok bool) {
	ev := heap.Pop(&s.inFlight).(endEvent)
	s.now = ev.at
	if ev.release {
		return 0, false
	}
	outcome = Served
	if ev.throttled {
		outcome = Throttled
		heap.Push(&s.inFlight, endEvent{at: s.now.Add(s.c.Period()), release: true})
	}
	// In flight: the calls and held slots left, and this one.
	s.c.Sample(s.now, outcome, s.now.Sub(ev.start), s.inFlight.Len()+1)
	return outcome, true
}

// simulate runs a saturated caller (always more calls waiting than the
// limit lets through) against b under Control for d of simulated time.
// phases change the backend at the given offsets.
func simulate(t *testing.T, seed uint64, cfg Config, b backend, d time.Duration, phases map[time.Duration]backend) simResult {
	t.Helper()
	s := newSim(seed, 2, cfg, b, phases)
	var served, throttled int
	var res simResult
	nextMark := d / 10
	for s.elapsed() < d {
		for s.inFlight.Len() < s.c.Limit() {
			s.startCall()
		}
		outcome, ok := s.next()
		if !ok {
			continue
		}
		if s.elapsed() > d/2 {
			if outcome == Throttled {
				throttled++
			} else {
				served++
			}
		}
		if s.elapsed() >= nextMark {
			res.limits = append(res.limits, s.c.Limit())
			nextMark += d / 10
		}
	}
	res.throughput = float64(served) / (d / 2).Seconds() / s.b.opsPerSecond()
	if served+throttled > 0 {
		res.throttledShare = float64(throttled) / float64(served+throttled)
	}
	res.finalLimit = s.c.Limit()
	return res
}

// Against each backend shape, a saturated caller ends up using at least
// 90 % of the backend's capacity with at most 2 % of its calls throttled,
// from the same defaults (no tuning per backend).
func TestControlReachesTheBackendsCapacityWithoutTuning(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    backend
		d    time.Duration
	}{
		// The mock driver's profiles (csimock.Profiles) and one backend
		// whose request limit is far below its capacity.
		{"slow-cloud: 2 s, 16 at once, 10 calls/s", backend{latency: 2 * time.Second, spread: 0.3, capacity: 16, rate: 10, burst: 20}, 30 * time.Minute},
		{"fast-san: 20 ms, 64 at once", backend{latency: 20 * time.Millisecond, spread: 0.2, capacity: 64}, time.Minute},
		{"throttling-api: 200 ms, 40 at once, 100 calls/s", backend{latency: 200 * time.Millisecond, spread: 0.25, capacity: 40, rate: 100, burst: 100}, 5 * time.Minute},
		{"API limit far below capacity: 100 ms, 200 at once, 50 calls/s", backend{latency: 100 * time.Millisecond, spread: 0.2, capacity: 200, rate: 50, burst: 50}, 5 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for seed := uint64(1); seed <= 8; seed++ {
				r := simulate(t, seed, DefaultConfig(256), tc.b, tc.d, nil)
				t.Logf("seed %d: throughput %.1f %% of capacity, %.2f %% throttled, limit over time %v", seed, 100*r.throughput, 100*r.throttledShare, r.limits)
				if r.throughput < 0.9 {
					t.Errorf("seed %d: throughput %.1f %% of the backend's capacity, want ≥ 90 %%", seed, 100*r.throughput)
				}
				if r.throttledShare > 0.02 {
					t.Errorf("seed %d: %.2f %% of calls throttled, want ≤ 2 %%", seed, 100*r.throttledShare)
				}
			}
		})
	}
}

// A backend that loses capacity mid-run: the limit comes down, and goes up
// again when the capacity is back.
func TestControlFollowsABackendThatDegradesAndRecovers(t *testing.T) {
	full := backend{latency: 200 * time.Millisecond, spread: 0.25, capacity: 40, rate: 100, burst: 100}
	degraded := backend{latency: 200 * time.Millisecond, spread: 0.25, capacity: 10, rate: 25, burst: 25}
	r := simulate(t, 1, DefaultConfig(256), full, 15*time.Minute, map[time.Duration]backend{5 * time.Minute: degraded, 10 * time.Minute: full})
	t.Logf("limit over time %v", r.limits)
	before, during, after := r.limits[2], r.limits[5], r.limits[9]
	if during >= before/2 || after <= during*2 {
		t.Errorf("limit before %d, during the degradation %d, after %d: want it to halve and come back", before, during, after)
	}
}

// throttling-api's degraded phase in a saturated run: 20 s at a quarter of
// the request limit leave the limit at 3 to 7, the creep zone of the
// degraded phase's throttling point. Once the backend is restored, the
// limit is back at 18 (0.9 × the 20 calls the request limit sustains)
// within 5 s on every seed: the creep speeds up when no throttled answer
// came for longer than usual (during the degraded phase those climbs
// are throttled at 6 to 13 and cut back). At 5 % per judged period it took 2.1 to
// 9.9 s (seven seeds of 12 over 5 s); now 1.4 to 4.5 s.
func TestControlRegainsARestoredRequestLimitWithinSeconds(t *testing.T) {
	full := backend{latency: 200 * time.Millisecond, spread: 0.25, capacity: 40, rate: 100, burst: 100}
	degraded := backend{latency: 200 * time.Millisecond, spread: 0.25, capacity: 10, rate: 25, burst: 25}
	for seed := uint64(1); seed <= 12; seed++ {
		s := newSim(seed, 2, DefaultConfig(100), full, map[time.Duration]backend{20 * time.Second: degraded, 40 * time.Second: full})
		var during int
		back := time.Duration(-1)
		for s.elapsed() < 60*time.Second && back < 0 {
			for s.inFlight.Len() < s.c.Limit() {
				s.startCall()
			}
			s.next()
			switch at := s.elapsed(); {
			case at > 35*time.Second && at < 40*time.Second:
				during = max(during, s.c.Limit())
			case at > 40*time.Second && s.c.Limit() >= 18:
				back = at - 40*time.Second
			}
		}
		t.Logf("seed %d: limit at most %d late in the degraded phase (its probes), back at 18 after %s", seed, during, back.Round(100*time.Millisecond))
		if back < 0 || back > 5*time.Second {
			t.Errorf("seed %d: limit back at 18 after %s of the restored backend, want within 5 s", seed, back.Round(100*time.Millisecond))
		}
	}
}

// The limit does not grow while the caller uses less than half of it,
// and stays within [Min, Max].
func TestControlStaysWithinItsBoundsAndDoesNotGrowWhenIdle(t *testing.T) {
	c := NewControl(Config{Initial: 10, Min: 2, Max: 20})
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for range 1000 {
		now = now.Add(10 * time.Millisecond)
		c.Sample(now, Served, 10*time.Millisecond, 3) // 3 of 10 in use
	}
	if c.Limit() != 10 {
		t.Errorf("limit after 1000 calls using 3 of it = %d, want 10", c.Limit())
	}
	for range 1000 {
		now = now.Add(10 * time.Millisecond)
		c.Sample(now, Served, 10*time.Millisecond, c.Limit())
	}
	if c.Limit() != 20 {
		t.Errorf("limit after 1000 flat calls using all of it = %d, want Max 20", c.Limit())
	}
	for range 100 {
		now = now.Add(time.Second)
		c.Sample(now, Throttled, time.Millisecond, c.Limit())
	}
	if c.Limit() != 2 || c.Throttled() != 100 {
		t.Errorf("after 100 throttled answers: limit %d (want Min 2), throttled %d", c.Limit(), c.Throttled())
	}
}

// A burst of throttled answers within one latency period cuts the limit
// once: by Backoff, or down to the calls served in the last period when
// those are fewer (what the backend sustained); ignored outcomes change
// nothing.
func TestControlCutsOncePerBurstOfThrottledAnswers(t *testing.T) {
	for _, tc := range []struct {
		name   string
		served int
		want   int
	}{
		{"70 % of the limit when the backend served more", 90, 70},
		{"the calls served in the last period when fewer", 20, 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := NewControl(Config{Initial: 100, Min: 1, Max: 200})
			now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			// Slow start is over (its growth would move the limit).
			c.slowStart = false
			for range tc.served {
				now = now.Add(time.Millisecond)
				c.Sample(now, Served, 500*time.Millisecond, 10)
			}
			for range 30 {
				now = now.Add(time.Millisecond)
				c.Sample(now, Throttled, time.Millisecond, 100)
			}
			if c.Limit() != tc.want {
				t.Errorf("limit after %d served and 30 throttled answers = %d, want one cut from 100 to %d", tc.served, c.Limit(), tc.want)
			}
		})
	}
	c := NewControl(Config{Initial: 100, Min: 1, Max: 200})
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for range 20 {
		now = now.Add(time.Millisecond)
		c.Sample(now, Served, 500*time.Millisecond, 10)
	}
	for range 30 {
		now = now.Add(time.Millisecond)
		c.Sample(now, Throttled, time.Millisecond, 100)
	}
	before := 100
	now = now.Add(time.Second)
	c.Sample(now, Throttled, time.Millisecond, 100)
	if c.Limit() >= int(math.Floor(float64(before)*0.7)) {
		t.Errorf("a throttled answer a latency period later did not cut again: limit %d", c.Limit())
	}
	l := c.Limit()
	for range 50 {
		c.Sample(now, Ignored, time.Hour, 1000)
	}
	if c.Limit() != l {
		t.Errorf("ignored outcomes changed the limit from %d to %d", l, c.Limit())
	}
}

// Under a load that never lets up, the limit does not creep up with a
// baseline that is only ever measured loaded: the probes keep the baseline
// the backend's own latency, and the limit stays near the capacity for
// half an hour (without the probes it doubles in that time). Seeds 3 and
// 4 too: when the period after a probe was judged, and its rate (calls
// started under the probe's half limit) was a growth's reference, they
// rose to 120 and 122 (a growth past the capacity passed for one the
// backend kept pace with, and its queued latency became the baseline).
func TestControlDoesNotCreepUpUnderSteadyLoad(t *testing.T) {
	b := backend{latency: 20 * time.Millisecond, spread: 0.2, capacity: 64}
	for _, seed := range []uint64{1, 3, 4} {
		r := simulate(t, seed, DefaultConfig(1000), b, 30*time.Minute, nil)
		t.Logf("seed %d: limit every 3 minutes %v", seed, r.limits)
		for i, l := range r.limits {
			if l > 64*8/5 {
				t.Errorf("seed %d: limit after %d minutes = %d, want at most 1.6 × the capacity of 64", seed, 3*(i+1), l)
			}
		}
		if r.throughput < 0.9 {
			t.Errorf("seed %d: throughput %.1f %% of capacity, want ≥ 90 %%", seed, 100*r.throughput)
		}
	}
}

// burstResult is a finite burst's outcome: how long n calls took to be
// served, and how many answers were throttled on the way.
type burstResult struct {
	wall      time.Duration
	throttled int
	limits    []int
}

// simulateBurst runs n calls, all waiting from the start, against b under
// Control, and returns when the last is served (a throttled call is tried
// again). phases change the backend at the given offsets, as csimock's
// phases do.
func simulateBurst(t *testing.T, seed uint64, cfg Config, b backend, n int, phases map[time.Duration]backend) burstResult {
	t.Helper()
	s := newSim(seed, 3, cfg, b, phases)
	var res burstResult
	s.serve(n, func(outcome Outcome) {
		if outcome == Throttled {
			res.throttled++
		}
		res.limits = append(res.limits, s.c.Limit())
	})
	res.wall = s.elapsed()
	return res
}

// serve runs n calls, all waiting from now, under the limit until each is
// served (a throttled call waits again at once), and calls answered with
// each answer's outcome.
func (s *sim) serve(n int, answered func(Outcome)) {
	waiting, served := n, 0
	for served < n {
		for ; waiting > 0 && s.inFlight.Len() < s.c.Limit(); waiting-- {
			s.startCall()
		}
		outcome, ok := s.next()
		if !ok {
			continue
		}
		if outcome == Throttled {
			waiting++
		} else {
			served++
		}
		answered(outcome)
	}
}

// A burst of calls, all waiting from the start, as csi-attacher sees when
// a StatefulSet of many replicas is created or deleted: from the default
// start (10 at once) the limit reaches the backend's pace fast enough that
// the burst is served within a few percent of the time a limit fixed at
// the backend's own concurrency (the oracle: its capacity, or the calls
// its request limit lets through per latency) takes, with at most 2 % of
// the calls throttled. The workloads are the mock driver's profiles with
// bench-peers' full sizes, three times as long.
func TestControlServesABurstNearlyAsFastAsAnOracle(t *testing.T) {
	degraded := backend{latency: 200 * time.Millisecond, spread: 0.25, capacity: 10, rate: 25, burst: 25}
	throttling := backend{latency: 200 * time.Millisecond, spread: 0.25, capacity: 40, rate: 100, burst: 100}
	for _, tc := range []struct {
		name     string
		b        backend
		n        int
		phases   map[time.Duration]backend
		oracle   int
		minShare float64
	}{
		{"slow-cloud", backend{latency: 2 * time.Second, spread: 0.3, capacity: 16, rate: 10, burst: 20}, 480, nil, 16, 0.9},
		{"fast-san", backend{latency: 20 * time.Millisecond, spread: 0.2, capacity: 64}, 12000, nil, 64, 0.9},
		// The oracle keeps 20 at once, what the request limit lets
		// through before and after the degradation (it is throttled
		// during it); the limit follows the degradation down and back.
		{"throttling-api", throttling, 3000, map[time.Duration]backend{20 * time.Second: degraded, 40 * time.Second: throttling}, 20, 0.85},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for seed := uint64(1); seed <= 6; seed++ {
				oracle := simulateBurst(t, seed, Config{Initial: tc.oracle, Min: tc.oracle, Max: tc.oracle}, tc.b, tc.n, maps.Clone(tc.phases))
				r := simulateBurst(t, seed, DefaultConfig(100), tc.b, tc.n, maps.Clone(tc.phases))
				share := oracle.wall.Seconds() / r.wall.Seconds()
				throttled := float64(r.throttled) / float64(r.throttled+tc.n)
				t.Logf("seed %d: %.1f s (oracle %.1f s: %.1f %%), %d throttled (%.2f %%), limit %v", seed, r.wall.Seconds(), oracle.wall.Seconds(), 100*share, r.throttled, 100*throttled, r.limitsSampled(12))
				if share < tc.minShare {
					t.Errorf("seed %d: the burst took %.1f s, %.1f %% of the oracle's pace (%.1f s), want ≥ %.0f %%", seed, r.wall.Seconds(), 100*share, oracle.wall.Seconds(), 100*tc.minShare)
				}
				if throttled > 0.02 {
					t.Errorf("seed %d: %.2f %% of calls throttled, want ≤ 2 %%", seed, 100*throttled)
				}
			}
		})
	}
}

// limitsSampled returns n limits spread over the run.
func (r burstResult) limitsSampled(n int) []int {
	step := max(1, len(r.limits)/n)
	var ls []int
	for i := 0; i < len(r.limits); i += step {
		ls = append(ls, r.limits[i])
	}
	return ls
}

// A backend that gets slower for every caller alike (not because of our
// load: shrinking does not bring its latency down; or the latency seen
// includes a busy machine's scheduling delay) does not drive the limit to
// its floor: a shrink below half of where the latency first shrank it,
// with the latency not come down, makes that latency the baseline instead,
// and the limit holds and grows from there.
func TestControlDoesNotShrinkToTheFloorWhenTheLatencyIsNotOurs(t *testing.T) {
	c := NewControl(DefaultConfig(100))
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	lat := 100 * time.Millisecond
	lowest := 100
	for i := range 20000 {
		if i == 5000 {
			if c.Limit() != 100 {
				t.Fatalf("limit before the slowdown = %d, want 100", c.Limit())
			}
			lat = 300 * time.Millisecond
		}
		// Every call sees the same latency, whatever the load.
		now = now.Add(lat / time.Duration(c.Limit()))
		c.Sample(now, Served, lat, c.Limit())
		if i > 5000 {
			lowest = min(lowest, c.Limit())
		}
	}
	if lowest < 50 {
		t.Errorf("the limit fell to %d after the backend got 3× slower for everyone, want no lower than half (50)", lowest)
	}
	if c.Limit() != 100 {
		t.Errorf("limit at the end = %d, want back at 100", c.Limit())
	}
}

// The first answers of a burst are its fastest calls (all started
// together), and while the limit grows the answers that come first are
// still the new calls' fastest: a baseline taken from them makes the next
// periods look queued. At the start of a bench-peers burst on slow-cloud,
// after one lone fast call (the bench's canary), the limit fell from 16 to
// 7. Here a lone 22 ms call, then a burst on a backend that never queues
// (every call 0.8 to 3.2 s, whatever the load): the first period of a burst
// is not a baseline (warm-up), and a shrink that would take the limit below
// half of where the latency first shrank it, with the latency not come
// down, takes that latency as the baseline instead. The limit never falls
// below half its highest (without the second rule it fell from 60 to 28).
func TestControlTakesNoBaselineFromABurstsFirstAnswers(t *testing.T) {
	c := NewControl(DefaultConfig(100))
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c.Sample(now, Served, 22*time.Millisecond, 1)
	now = now.Add(5 * time.Second)
	latencies := []time.Duration{800, 900, 1000, 1100, 2400, 2500, 2600, 2800, 3000, 3200}
	var inFlight events
	next := 0
	start := func() {
		lat := latencies[next%len(latencies)] * time.Millisecond
		next++
		heap.Push(&inFlight, endEvent{at: now.Add(lat), start: now})
	}
	high := c.Limit()
	for range 2000 {
		for inFlight.Len() < c.Limit() {
			start()
		}
		ev := heap.Pop(&inFlight).(endEvent)
		now = ev.at
		c.Sample(now, Served, now.Sub(ev.start), inFlight.Len()+1)
		high = max(high, c.Limit())
		if c.Limit() < high/2 {
			t.Fatalf("at %s the limit fell to %d, less than half its highest %d (%s; baseline %s), on a backend that never queues", now.Format("15:04:05.000"), c.Limit(), high, c.Reason(), c.Baseline())
		}
	}
}

// On a machine whose CPU the API server saturates during a burst, the
// latency csi-attacher sees of a fast backend that never queues rises and
// falls with the machine's load (scheduling delay), whatever csi-attacher
// keeps in flight: 20 ms calls seen at 20 to 70 ms, the host's load
// changing every few hundred milliseconds. Cuts the latency does not come
// down after are undone by the rules above (a latency that is not ours
// becomes the baseline): the limit, time-averaged, stays near its bound.
// (In the bench's saturated bursts the limit still averages lower: there
// the mock driver shares the two cores with the API server and the
// attacher, so the latency does rise with the calls in flight; see
// docs/performance.md.)
func TestControlKeepsItsLimitWhenTheHostsLoadMovesTheLatency(t *testing.T) {
	for seed := uint64(1); seed <= 6; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		c := NewControl(DefaultConfig(100))
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		start := now
		var inFlight events
		factor, nextChange := 1.0, now
		var weighted, total float64
		last := now
		for now.Sub(start) < 60*time.Second {
			for inFlight.Len() < c.Limit() {
				if !now.Before(nextChange) {
					factor = 1 + 2.5*rng.Float64()
					nextChange = now.Add(time.Duration(200+rng.IntN(400)) * time.Millisecond)
				}
				lat := time.Duration(float64(20*time.Millisecond) * factor * math.Exp(0.1*rng.NormFloat64()))
				heap.Push(&inFlight, endEvent{at: now.Add(lat), start: now})
			}
			ev := heap.Pop(&inFlight).(endEvent)
			if now.Sub(start) > 5*time.Second {
				weighted += float64(c.Limit()) * ev.at.Sub(last).Seconds()
				total += ev.at.Sub(last).Seconds()
			}
			last, now = ev.at, ev.at
			c.Sample(now, Served, now.Sub(ev.start), inFlight.Len()+1)
		}
		mean := weighted / total
		t.Logf("seed %d: mean limit %.1f of 100", seed, mean)
		if mean < 80 {
			t.Errorf("seed %d: the limit averaged %.1f, want ≥ 80 of its bound 100: a backend that never queues, seen slower and faster with the host's load, cut csi-attacher's calls", seed, mean)
		}
	}
}

// hostLoad is the load of the other processes on a shared host, as a
// factor on every call's latency: a function of time alone, a new value
// between lo and hi every 200 to 600 ms (the API server's use of the CPU
// in a bench burst comes and goes that way).
func hostLoad(seed uint64, lo, hi float64) func(time.Duration) float64 {
	rng := rand.New(rand.NewPCG(seed, 9))
	var ends []time.Duration
	var factors []float64
	for end := time.Duration(0); end < time.Hour; {
		end += time.Duration(200+rng.IntN(400)) * time.Millisecond
		ends = append(ends, end)
		factors = append(factors, lo+(hi-lo)*rng.Float64())
	}
	return func(at time.Duration) float64 {
		i, _ := slices.BinarySearch(ends, at)
		return factors[min(i, len(factors)-1)]
	}
}

// latencyModel gives a call started at (since the start of the run) with
// inFlight calls running (itself included) its latency.
type latencyModel func(at time.Duration, inFlight int, rng *rand.Rand) time.Duration

// simulateArrivals runs n calls that arrive at perSecond (Poisson) and
// wait, in order, for a slot under Control's limit: an attacher whose
// VolumeAttachments come at the pace the API server sets. It returns when
// the last call was served and the 99th percentile of arrival → served.
func simulateArrivals(seed uint64, cfg Config, n int, perSecond float64, model latencyModel) (wall, p99 time.Duration) {
	rng := rand.New(rand.NewPCG(seed, 4))
	arrivals := rand.New(rand.NewPCG(seed, 5))
	c := NewControl(cfg)
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now, next := start, start
	var inFlight events
	// waiting holds the arrival times of the calls without a slot;
	// arrived the arrival time of each call in flight, by its start.
	var waiting []time.Time
	arrived := map[time.Time]time.Time{}
	var waits []time.Duration
	for count := 0; len(waits) < n; {
		if count < n && (inFlight.Len() == 0 || next.Before(inFlight[0].at)) {
			now = next
			waiting = append(waiting, now)
			count++
			next = now.Add(time.Duration(arrivals.ExpFloat64() / perSecond * float64(time.Second)))
		} else {
			ev := heap.Pop(&inFlight).(endEvent)
			now = ev.at
			waits = append(waits, now.Sub(arrived[ev.start]))
			delete(arrived, ev.start)
			c.Sample(now, Served, now.Sub(ev.start), inFlight.Len()+1)
		}
		for len(waiting) > 0 && inFlight.Len() < c.Limit() {
			started := now
			for _, taken := arrived[started]; taken; _, taken = arrived[started] {
				started = started.Add(time.Nanosecond) // one start time per call
			}
			arrived[started] = waiting[0]
			waiting = waiting[1:]
			heap.Push(&inFlight, endEvent{at: started.Add(model(started.Sub(start), inFlight.Len()+1, rng)), start: started})
		}
	}
	slices.Sort(waits)
	return now.Sub(start), waits[len(waits)*99/100]
}

// simulateSaturated runs a saturated caller (always more calls waiting
// than the limit lets through) for d and returns the answers served per
// second and the time-averaged limit, both after the first 5 seconds.
func simulateSaturated(seed uint64, cfg Config, d time.Duration, model latencyModel) (perSecond, meanLimit float64) {
	rng := rand.New(rand.NewPCG(seed, 6))
	c := NewControl(cfg)
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now, last := start, start
	var inFlight events
	var served int
	var weighted float64
	for now.Sub(start) < d {
		for inFlight.Len() < c.Limit() {
			heap.Push(&inFlight, endEvent{at: now.Add(model(now.Sub(start), inFlight.Len()+1, rng)), start: now})
		}
		ev := heap.Pop(&inFlight).(endEvent)
		if now.Sub(start) > 5*time.Second {
			weighted += float64(c.Limit()) * ev.at.Sub(last).Seconds()
			served++
		}
		last, now = ev.at, ev.at
		c.Sample(now, Served, now.Sub(ev.start), inFlight.Len()+1)
	}
	measured := (d - 5*time.Second).Seconds()
	return float64(served) / measured, weighted / measured
}

// fixedAt is a Config whose limit never moves from n.
func fixedAt(n int) Config { return Config{Initial: n, Min: n, Max: n} }

// The saturated burst of bench-peers, where the API server sets the pace
// (VolumeAttachments arrive at 300 a second) and shares two cores with
// the mock driver: a 20 ms ControllerPublish is seen at 30 to 70 ms with
// the host's load, which comes and goes whatever csi-attacher does, and
// it grows with the calls in flight too (the driver's own share of the
// CPU), so that more calls in flight always serve a little faster. There
// the limit read the host's latency as the backend queueing and cut (in
// the limit's -v=4 log, 52 → 15 several times in a burst), and calls
// waited for slots. In this simulation, before a cut was judged by the
// answers served per second, five bursts of 24 took 4 to 28 % longer than
// under a limit fixed at the bound, the worst with 6 × its p99 of arrival
// → served. A cut after which the answers served per second fell by more
// than half as much as the limit is undone now: one burst takes 13 %
// longer (p99 3.4 ×), the others within 1 %, and the medians match the
// fixed limit's.
func TestControlKeepsAFixedLimitsPaceWhenTheHostsLoadSetsTheLatency(t *testing.T) {
	var paces, ratios []float64
	for seed := uint64(1); seed <= 24; seed++ {
		load := hostLoad(seed, 1.5, 3.5)
		model := func(at time.Duration, inFlight int, rng *rand.Rand) time.Duration {
			return time.Duration(float64(20*time.Millisecond) * (1 + float64(inFlight)/20) * load(at) * math.Exp(0.2*rng.NormFloat64()))
		}
		wall, p99 := simulateArrivals(seed, DefaultConfig(100), 3000, 300, model)
		fixedWall, fixedP99 := simulateArrivals(seed, fixedAt(100), 3000, 300, model)
		pace, ratio := fixedWall.Seconds()/wall.Seconds(), p99.Seconds()/fixedP99.Seconds()
		paces, ratios = append(paces, pace), append(ratios, ratio)
		t.Logf("seed %d: %.2f s, %.1f %% of the fixed limit's pace; p99 %s, %.2f × the fixed limit's", seed, wall.Seconds(), 100*pace, p99.Round(time.Millisecond), ratio)
		if pace < 0.85 {
			t.Errorf("seed %d: the burst took %.2f s, %.1f %% of the pace of a limit fixed at 100 (%.2f s), want ≥ 85 %%", seed, wall.Seconds(), 100*pace, fixedWall.Seconds())
		}
		if ratio > 4 {
			t.Errorf("seed %d: p99 of arrival → served %s, %.2f × the fixed limit's %s, want ≤ 4 ×", seed, p99.Round(time.Millisecond), ratio, fixedP99.Round(time.Millisecond))
		}
	}
	slices.Sort(paces)
	slices.Sort(ratios)
	t.Logf("median: %.1f %% of the fixed limit's pace, p99 %.2f × the fixed limit's", 100*paces[len(paces)/2], ratios[len(ratios)/2])
	if median := paces[len(paces)/2]; median < 0.99 {
		t.Errorf("median pace %.1f %% of the fixed limit's, want ≥ 99 %%", 100*median)
	}
	if median := ratios[len(ratios)/2]; median > 1.15 {
		t.Errorf("median p99 %.2f × the fixed limit's, want ≤ 1.15 ×", median)
	}
}

// Saturated callers against two backends where more calls in flight serve
// no faster past a knee, and the latency rises with them: the limit keeps
// at least 95 % of the throughput of a limit fixed at its bound (100).
//   - a shared resource that serves 250 calls a second, one at a time,
//     in front of a 20 ms latency: past 5 calls in flight the others
//     queue for it;
//   - a host whose CPU the calls share: 20 ms up to 30 calls in flight,
//     growing in proportion beyond, and 1 to 3.5 × that with the other
//     processes' load (coming and going whatever the calls do).
func TestControlKeepsTheThroughputOfABackendThatServesNoFasterPastAKnee(t *testing.T) {
	for _, tc := range []struct {
		name  string
		model func(seed uint64) latencyModel
	}{
		{"a shared resource of 250 calls a second", func(uint64) latencyModel {
			var free time.Duration // when the resource is next free
			return func(at time.Duration, _ int, rng *rand.Rand) time.Duration {
				free = max(free, at) + time.Second/250
				return free - at + time.Duration(float64(20*time.Millisecond)*math.Exp(0.2*rng.NormFloat64()))
			}
		}},
		{"a host's shared CPU", func(seed uint64) latencyModel {
			load := hostLoad(seed, 1, 3.5)
			return func(at time.Duration, inFlight int, rng *rand.Rand) time.Duration {
				return time.Duration(float64(20*time.Millisecond) * math.Max(1, float64(inFlight)/30) * load(at) * math.Exp(0.1*rng.NormFloat64()))
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for seed := uint64(1); seed <= 8; seed++ {
				rate, limit := simulateSaturated(seed, DefaultConfig(100), time.Minute, tc.model(seed))
				fixed, _ := simulateSaturated(seed, fixedAt(100), time.Minute, tc.model(seed))
				t.Logf("seed %d: %.0f answers/s, %.1f %% of the fixed limit's %.0f; mean limit %.1f", seed, rate, 100*rate/fixed, fixed, limit)
				if rate < 0.95*fixed {
					t.Errorf("seed %d: %.0f answers a second, %.1f %% of a limit fixed at 100 (%.0f), want ≥ 95 %%", seed, rate, 100*rate/fixed, fixed)
				}
			}
		})
	}
}

// Bursts of 240 calls against slow-cloud's request limit (10 calls a
// second, a bucket of 20), each started 0.1 s after the last answer of the
// one before, as bench-peers' detach burst follows its attach burst. A
// burst starts all its calls at once, and finds only what the bucket
// refilled while the one before ended; the limit that burst's tail grew to
// was paced by its answers. Once the backend has throttled, the limit
// comes down, when an answer leaves no call in flight, to what its request
// limit let through, and no later burst has a throttled answer in its
// first second (they start with 12 to 19 calls). Before, every seed
// failed: bursts after a throttled answer started with 21 to 29 calls, 1
// to 9 of them throttled, and a throttled start's cut went to the answers
// of the previous burst's tail (9 on bench-peers' seed 8).
func TestControlStartsABurstAfterAnIdleMomentWithinTheRequestLimit(t *testing.T) {
	b := backend{latency: 2 * time.Second, spread: 0.3, capacity: 16, rate: 10, burst: 20}
	for seed := uint64(1); seed <= 12; seed++ {
		s := newSim(seed, 12, DefaultConfig(100), b, nil)
		var starts, throttledAtStart []int
		throttledBefore := false
		for burst := range 4 {
			throttled := 0
			start, began := s.c.Limit(), s.now
			s.serve(240, func(outcome Outcome) {
				if outcome != Throttled || s.now.Sub(began) >= time.Second {
					return
				}
				throttled++
				if throttledBefore {
					t.Errorf("seed %d: burst %d, started with %d calls at once after the backend had throttled, throttled a call %s after its start", seed, burst+1, start, s.now.Sub(began).Round(time.Millisecond))
				}
			})
			throttledBefore = throttledBefore || s.c.Throttled() > 0
			starts, throttledAtStart = append(starts, start), append(throttledAtStart, throttled)
			s.now = s.now.Add(100 * time.Millisecond)
		}
		t.Logf("seed %d: the bursts started with %v calls at once; throttled in their first second %v", seed, starts, throttledAtStart)
	}
}

// bench-peers runs fast-san's burst (20 ms, 64 at once) 2 s after
// slow-cloud's (2 s), with the same limit. The first period of fast-san's
// burst is 4 × faster than the baseline (100 ×): another backend. The
// limit forgets slow-cloud's baseline and throttling point and begins
// slow start again, and it reaches fast-san's capacity of 64 within the
// first quarter of the attach burst's answers on every seed. Before,
// bursts 2 s apart were one burst (no answer for three periods of
// slow-cloud's 2-3 s was the only sign of an idle backend): fast-san's
// first answers were judged in slow-cloud's period, and from the 19-25
// slow-cloud left the limit reached 19-27 in that quarter, 64 on none of
// the 12 seeds.
func TestControlBeginsSlowStartAgainForABurstAgainstAFasterBackend(t *testing.T) {
	for seed := uint64(1); seed <= 12; seed++ {
		c := NewControl(DefaultConfig(100))
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		ps := benchProfiles()
		_, now = benchBurst(seed, c, ps[0], now)
		before := c.Limit()
		r, _ := benchBurst(seed, c, ps[1], now.Add(2*time.Second))
		early := slices.Max(r.limits[:len(r.limits)/4])
		t.Logf("seed %d: limit %d after slow-cloud, at most %d over the first quarter of fast-san's answers", seed, before, early)
		if early < 64 {
			t.Errorf("seed %d: the limit reached %d over the first quarter of fast-san's answers (from %d after slow-cloud), want fast-san's capacity of 64", seed, early, before)
		}
	}
}
