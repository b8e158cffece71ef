package adaptive

import (
	"container/heap"
	"math"
	"math/rand/v2"
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

// simulate runs a saturated caller (always more calls waiting than the
// limit lets through) against b under Control for d of simulated time.
// phases change the backend at the given offsets.
func simulate(t *testing.T, seed uint64, cfg Config, b backend, d time.Duration, phases map[time.Duration]backend) simResult {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 2))
	c := NewControl(cfg)
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := start
	var inFlight events
	tokens, filled := b.burst, now
	var served, throttled int
	var res simResult
	nextMark := d / 10
	for now.Sub(start) < d {
		for off, nb := range phases {
			if now.Sub(start) >= off {
				b = nb
				delete(phases, off)
			}
		}
		// Start calls up to the limit.
		for inFlight.Len() < c.Limit() {
			if b.rate > 0 {
				tokens = math.Min(b.burst, tokens+now.Sub(filled).Seconds()*b.rate)
				filled = now
				if tokens < 1 {
					// Throttled at once (a round trip of 1 ms).
					heap.Push(&inFlight, endEvent{at: now.Add(time.Millisecond), start: now, throttled: true})
					continue
				}
				tokens--
			}
			running := inFlight.Len() + 1
			lat := float64(b.latency) * math.Exp(b.spread*rng.NormFloat64())
			if running > b.capacity {
				lat *= float64(running) / float64(b.capacity)
			}
			heap.Push(&inFlight, endEvent{at: now.Add(time.Duration(lat)), start: now})
		}
		ev := heap.Pop(&inFlight).(endEvent)
		now = ev.at
		if ev.release {
			continue
		}
		if ev.throttled {
			heap.Push(&inFlight, endEvent{at: now.Add(c.Period()), release: true})
		}
		outcome := Served
		if ev.throttled {
			outcome = Throttled
		}
		if now.Sub(start) > d/2 {
			if ev.throttled {
				throttled++
			} else {
				served++
			}
		}
		// In flight: the calls and held slots left, and this one.
		c.Sample(now, outcome, now.Sub(ev.start), inFlight.Len()+1)
		if now.Sub(start) >= nextMark {
			res.limits = append(res.limits, c.Limit())
			nextMark += d / 10
		}
	}
	res.throughput = float64(served) / (d / 2).Seconds() / b.opsPerSecond()
	if served+throttled > 0 {
		res.throttledShare = float64(throttled) / float64(served+throttled)
	}
	res.finalLimit = c.Limit()
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
// once; ignored outcomes change nothing.
func TestControlCutsOncePerBurstOfThrottledAnswers(t *testing.T) {
	c := NewControl(Config{Initial: 100, Min: 1, Max: 200})
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for range 20 {
		now = now.Add(time.Millisecond)
		c.Sample(now, Served, 500*time.Millisecond, 10)
	}
	before := c.Limit()
	for range 30 {
		now = now.Add(time.Millisecond)
		c.Sample(now, Throttled, time.Millisecond, 100)
	}
	if want := int(math.Floor(float64(before) * 0.7)); c.Limit() != want {
		t.Errorf("limit after 30 throttled answers in 30 ms = %d, want one cut from %d to %d", c.Limit(), before, want)
	}
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
// half an hour (without the probes it doubles in that time).
func TestControlDoesNotCreepUpUnderSteadyLoad(t *testing.T) {
	b := backend{latency: 20 * time.Millisecond, spread: 0.2, capacity: 64}
	r := simulate(t, 1, DefaultConfig(1000), b, 30*time.Minute, nil)
	t.Logf("limit every 3 minutes %v", r.limits)
	for i, l := range r.limits {
		if l > 64*8/5 {
			t.Errorf("limit after %d minutes = %d, want at most 1.6 × the capacity of 64", 3*(i+1), l)
		}
	}
	if r.throughput < 0.9 {
		t.Errorf("throughput %.1f %% of capacity, want ≥ 90 %%", 100*r.throughput)
	}
}
