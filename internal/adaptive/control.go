// Package adaptive bounds how many calls to a storage backend are in flight
// with a limit that follows what the backend can take: it grows while the
// calls' latency stays flat and backs off when the backend throttles or
// its latency rises. csi-attacher bounds its ControllerPublishVolume and
// ControllerUnpublishVolume calls with it (docs/performance.md, "Adaptive
// driver concurrency").
//
// The rule (Control) is pure: latency samples and outcomes in, a limit
// out, on the caller's clock. The Limiter around it hands out slots to two
// directions (attach and detach) so that neither starves the other.
//
// The algorithm works in periods of one mean call latency (TCP's "once per
// round trip"), in the family of TCP Vegas and Netflix's concurrency-limits
// gradient, with TCP's multiplicative decrease on throttling:
//
//   - the baseline is the lowest mean latency of a period within the last
//     BaselineWindow: the backend's latency when it is not queueing;
//   - slow start: from Initial, every answer served while the limit is
//     in use (at least half of it in flight) adds one, so the limit
//     doubles once per round trip (TCP's slow start); it ends when the
//     answers' running mean rises above Grow × the lowest running mean
//     seen, or at the first throttled answer. The latency shows the
//     queue one round trip late, when the limit has doubled: if the
//     answers served per second stopped growing with the limit in the
//     last period (BBR's full pipe), the limit goes back to Grow × that
//     rate × the lowest running mean, never below half;
//   - after a cut for a queue our calls built (slow start's end, a
//     throttled answer ending slow start, a latency cut) periods are
//     not judged until most of their answers come from calls started
//     after it: on a 2 s backend the queued calls answer for several
//     periods, and their latency would cut again or, taken as not ours,
//     restart slow start;
//   - after it, each period compares its mean latency with the baseline.
//     Below Grow × baseline the backend is not queueing our calls and the
//     limit grows by √limit; above Shrink × baseline it is, and the limit
//     shrinks in proportion (never below half); in between it holds. A
//     period right after a change is not judged (its calls started under
//     the old limit);
//   - the first period of a burst (at the start, after an idle gap of
//     three periods, or when its calls started after an answer left none
//     in flight) is not judged and gives no baseline: its answers are
//     the burst's fastest calls. If their mean is 4 × below or above the
//     baseline, the burst is against another backend: the baseline and
//     what throttling taught are forgotten, and against a faster one
//     the limit goes back to where it was before the idle cap (below)
//     and slow start begins again;
//   - when an answer leaves no call in flight and a request limit
//     never throttled, slow start begins again from Initial (TCP's
//     restart after idle); when one did, the limit comes down to
//     what the backend's request limit let through when it last
//     throttled (the answers served within one baseline latency before
//     that cut, or 0.7 × a burst's start that was throttled itself): a
//     burst starts all its calls at once and finds only the request
//     limit's bucket, while the limit it grew to under load was paced
//     by the answers;
//   - if a shrink would take the limit below half of where the latency
//     first shrank it and the latency has not come down with it, the
//     latency is not our calls queueing (the backend got slower for
//     everyone, a busy machine's scheduling delay is in it, or the
//     baseline came from lucky calls): the latency becomes the baseline,
//     the limit stops falling, and slow start begins again;
//   - a latency cut is judged by the answers served per second (the
//     delivered rate) of the first period after it: if the rate fell
//     by more than half as much as the limit and the latency did not
//     come down in proportion, the latency was not calls queueing behind
//     ours (a queue serves as fast with fewer calls waiting in it) but
//     the backend's or a busy host's own, and the cut only cost
//     throughput. The limit goes back to where it was, that latency
//     becomes the baseline, slow start begins again from there, and no
//     latency cut goes below that limit while it delivers at least 0.8
//     × its rate. A bench-peers saturated burst showed it: the API
//     server and csi-attacher share the host's cores with the mock
//     driver, whose 20 ms calls were seen at 35 to 70 ms, and the limit
//     fell from 52 to 15 several times in a burst while calls waited;
//   - a growth is judged the same way: if the latency rose above Grow ×
//     the baseline but the rate grew by at least 0.75 × as much as the
//     limit (than in the better of the two periods before), the backend
//     is not queueing our calls, and that latency becomes the baseline;
//   - a throttled answer's cut is followed by a period that is not
//     judged, as a period's change is. When it cut to the answers the
//     backend served in the last period, its queue drains (as after a
//     latency cut, but until at most one answer in eight is an old
//     one) and no latency cut goes below it while those answers per
//     second hold; the same floor follows slow start's end;
//   - the limit grows only while it is in use: an idle backend does not
//     push it up;
//   - a throttled answer (the backend's request limit: ResourceExhausted
//     or Unavailable) cuts the limit by Backoff, or down to the calls the
//     backend served in the last period when those are fewer (after slow
//     start overshot a request limit, one cut lands near it), at most once
//     per period, and remembers where: growth between 0.9 and 1.3 × that
//     point slows to a creep, so a request limit is approached carefully
//     instead of hit every period, and beyond it growth is normal again
//     (the backend recovered). The creep begins lower when the answers
//     served between two throttled cuts show that the request limit
//     sustains fewer calls at once (its bucket let the limit run past it
//     for a while). When no throttled answer came for longer than usual
//     (0.75 × the smoothed time between cuts, at least ten periods), the
//     creep doubles every two periods: a backend that recovered is found
//     in a few periods instead of seconds at 5 % per judged period; a
//     throttled answer that ends such a climb cuts back to 1.1 × the
//     limit where it sped up. The Limiter keeps a throttled call's slot
//     for one period, so that refused calls do not come back faster than
//     real ones;
//   - once every half BaselineWindow the limit is halved until the calls
//     started after that have answered: their latency is a fresh baseline
//     candidate (a load that never lets up would otherwise make the
//     baseline a loaded latency, and the limit would creep up with it);
//   - the limit stays within [Min, Max].
package adaptive

import (
	"math"
	"time"
)

// Outcome is what a call's answer says about the backend.
type Outcome int

const (
	// Served: the backend did the work (or refused it for the volume's own
	// reasons: not found, invalid); its latency is a sample of the
	// backend's load.
	Served Outcome = iota
	// Throttled: the backend refused the call for load (its request
	// limit, or unavailable): the limit backs off.
	Throttled
	// Ignored: the call says nothing about the backend's load (it timed
	// out on our side, the caller gave up, the connection broke); no
	// sample.
	Ignored
)

// Config tunes Control. Zero fields take the defaults of DefaultConfig.
type Config struct {
	// Initial is the limit to start with.
	Initial int
	// Min and Max bound the limit.
	Min, Max int
	// Grow and Shrink are the latency ratios (a period's mean over the
	// baseline) below which the limit grows and above which it shrinks.
	Grow, Shrink float64
	// Backoff multiplies the limit on a throttled answer.
	Backoff float64
	// BaselineWindow is how long the lowest period latency counts as the
	// baseline.
	BaselineWindow time.Duration
}

// DefaultConfig is the configuration csi-attacher uses; maxLimit is its
// bound (--worker-threads, or the default bound when the flag is unset).
func DefaultConfig(maxLimit int) Config {
	maxLimit = max(maxLimit, 1)
	return Config{
		Initial:        min(10, maxLimit),
		Min:            min(2, maxLimit),
		Max:            maxLimit,
		Grow:           1.25,
		Shrink:         1.5,
		Backoff:        0.7,
		BaselineWindow: 10 * time.Minute,
	}
}

func (c Config) withDefaults() Config {
	d := DefaultConfig(c.Max)
	if c.Max <= 0 {
		c.Max = d.Max
	}
	if c.Min <= 0 {
		c.Min = min(d.Min, c.Max)
	}
	c.Min = min(c.Min, c.Max)
	if c.Initial <= 0 {
		c.Initial = d.Initial
	}
	c.Initial = max(c.Min, min(c.Initial, c.Max))
	if c.Grow <= 1 {
		c.Grow = d.Grow
	}
	if c.Shrink <= c.Grow {
		c.Shrink = max(d.Shrink, c.Grow*1.2)
	}
	if c.Backoff <= 0 || c.Backoff >= 1 {
		c.Backoff = d.Backoff
	}
	if c.BaselineWindow <= 0 {
		c.BaselineWindow = d.BaselineWindow
	}
	return c
}

// minPeriodSamples is the fewest answers a period judges the backend by.
const minPeriodSamples = 4

// slowStartSamples is how many answers slow start's running mean takes
// before it judges; slowStartAlpha the running mean's weight of each.
const (
	// idleGapPeriods: no answer for this many periods means the backend
	// was idle, and the next answers begin a burst.
	idleGapPeriods   = 3
	slowStartSamples = 8
	slowStartAlpha   = 0.1
)

// Control is the limit rule. It is not safe for concurrent use: the
// Limiter serializes it.
type Control struct {
	cfg   Config
	limit float64
	// slowStart lasts until the first sign of queueing or throttling.
	// During it the limit grows by one for each answer served while the
	// limit is in use (doubling once per round trip, as TCP's slow start
	// does), judged by the answers' running mean against the lowest one
	// seen (ssMean, ssBase) instead of by periods.
	slowStart bool
	ssMean    ewma
	ssBase    float64
	ssN       int
	// served are the latest served answers (when, and the limit then),
	// within two periods: how many calls the backend served in the last
	// period, the concurrency it sustained (what a throttled answer cuts
	// to), and whether that still grew over the period before (fullPipe).
	served []servedAt
	// settling: the limit changed at the end of the last period, so the
	// next one is not judged.
	settling bool
	// The current period: when it began and ends, the sum and count of
	// its latencies, and the most calls in flight during it.
	periodStart time.Time
	periodEnd   time.Time
	sum         time.Duration
	n           int
	busiest     int
	lastPeriod  time.Duration
	smoothed    ewma
	baseline    windowMin
	// lastCut is when a throttled answer last cut the limit, cutAt the
	// limit it cut.
	lastCut time.Time
	cutAt   float64
	// point is the concurrency the backend's request limit sustains, as
	// the answers served between two throttled cuts last showed (0: not
	// known); servedSinceCut counts the answers served since lastCut.
	point          float64
	servedSinceCut int
	// cycle is the smoothed time between two throttled cuts; accelFrom
	// the limit where the creep near a throttling point began to speed
	// up since the last cut (0: it has not).
	cycle     ewma
	accelFrom float64
	// shrunk is the last latency cut, judged by the first period after
	// it settled: the limit, delivered rate and mean latency before it.
	shrunk rateCheck
	// grew is the last growth, judged the same way: the limit and
	// delivered rate before it.
	grew rateCheck
	// floor is the limit that a latency cut proved to be needed (cutting
	// below it cost throughput), floorRate the rate it delivered: while
	// the rate holds, latency does not cut below it.
	floor     float64
	floorRate float64
	// prevRate is the delivered rate of the last judged period; a
	// check compares with the better of it and the rate of the period
	// that decided the change (one period's count is noisy).
	prevRate float64
	// The baseline probe (probe): whether one runs, since when, the
	// limit it will restore, and the latencies of the calls started
	// during it; lastProbe is when the last one ended.
	probing    bool
	probeStart time.Time
	// probePeriod is the period when the probe began.
	probePeriod time.Duration
	probeSaved  float64
	probeSum    time.Duration
	probeN      int
	lastProbe   time.Time
	// shrinkFrom is the limit when latency last began to shrink it (0
	// once the latency let it grow again), shrinkMean the mean latency
	// of that period.
	shrinkFrom float64
	shrinkMean time.Duration
	// drainCut is when the limit was last cut for a queue our calls
	// built (slow start's end, a throttled answer that ended slow start
	// or cut to the answers served, a latency cut; zero: none to
	// drain). Until most of a period's answers come from calls started
	// after it, periods are not judged and give no baseline: on a slow
	// backend the queued calls answer for several periods, and their
	// latency is the queue's from before the cut. drainOld counts the
	// current period's answers from calls started before it. After a
	// throttled cut to the answers served (drainServed), a period is
	// judged only once at most one answer in drainServedShare is an old
	// one: that cut already lands on what the backend served, and the
	// queue it leaves behind was built far above it (on slow-cloud,
	// slow start throttled at 33-47 and cut to 13-19), so that a period
	// with a third of its answers from it still looked queued and cut
	// the limit again, to 8-12.
	drainCut    time.Time
	drainOld    int
	drainServed bool
	// warmup: the current period is the first of a burst (after the
	// start, an idle gap, or an answer that left no call in flight);
	// lastSample is when the last answer came; idleAt when the last
	// answer that left no call in flight came (zero: calls are in
	// flight since).
	warmup     bool
	lastSample time.Time
	idleAt     time.Time
	// startCap is how many calls a burst may start at once after the
	// backend was idle (0: no bound): what the backend's request limit
	// let through when it last throttled. idleFrom is the limit before
	// the last answer of a burst brought it down to startCap (0: it did
	// not), restored if the next burst is against a faster backend.
	startCap float64
	idleFrom float64
	// reason is why the limit last changed.
	reason string
	// throttled counts throttled answers (each one, cut or not).
	throttled int64
}

// NewControl returns a Control at cfg.Initial.
func NewControl(cfg Config) *Control {
	cfg = cfg.withDefaults()
	return &Control{cfg: cfg, limit: float64(cfg.Initial), slowStart: true, warmup: true, ssMean: ewma{alpha: slowStartAlpha},
		smoothed: ewma{alpha: 0.3}, baseline: windowMin{window: cfg.BaselineWindow}, cycle: ewma{alpha: 0.3}}
}

// Limit is the current limit, rounded down, within [Min, Max].
func (c *Control) Limit() int { return int(c.limit) }

// Throttled is the number of throttled answers seen.
func (c *Control) Throttled() int64 { return c.throttled }

// Config is the configuration in force (defaults filled in).
func (c *Control) Config() Config { return c.cfg }

// Period is the mean latency of the last period: how long the Limiter
// keeps a throttled call's slot.
func (c *Control) Period() time.Duration { return c.lastPeriod }

// Sample takes one call's answer: its outcome, its latency, and how many
// calls were in flight when it ended (itself included). now is when it
// ended; samples come in the order calls end.
func (c *Control) Sample(now time.Time, outcome Outcome, latency time.Duration, inFlight int) {
	switch outcome {
	case Ignored:
		return
	case Throttled:
		c.throttled++
		if !c.lastCut.IsZero() && now.Sub(c.lastCut) < c.lastPeriod {
			return
		}
		c.learnPoint(now)
		// Cut by Backoff, and at least down to the calls the backend
		// served in the last period: after a slow start that doubled the
		// limit past the request limit, one cut lands near it instead
		// of several cuts a period apart, each with its round of
		// throttled calls.
		cut := math.Floor(c.limit * c.cfg.Backoff)
		delivered := c.deliveredLocked(now)
		d := float64(delivered)
		if !c.idleAt.IsZero() && !now.Add(-latency).Before(c.idleAt) {
			// The call began a burst after the backend was idle: the
			// answers of the last period are the previous burst's tail,
			// no measure of what the backend lets through (on
			// slow-cloud, a detach burst starting 21 calls into a bucket
			// of 20 was cut to the attach burst's last 9 answers). The
			// burst started too many at once: the next one starts with
			// the cut limit.
			d = 0
			c.startCap = cut
		} else if s := c.servedWithinBaseline(now); s >= minPeriodSamples {
			// What the request limit let through at the backend's own
			// latency: no burst after an idle moment starts more calls
			// at once (its bucket let the limit run past it while it
			// refilled, and a burst that starts all its calls at once
			// finds only the bucket).
			c.startCap = s
		}
		if d >= minPeriodSamples && d < cut {
			cut = d
		}
		// The cut lands on the answers served: the limit was above what
		// the backend served, and the calls started above it queue (or
		// ran into the request limit). Its queue drains before the next
		// judgement, and while the answers per second hold no latency
		// cut goes below the answers served.
		toServed := d >= minPeriodSamples && d <= cut
		if c.accelFrom > 0 {
			// The throttled answer ends a climb that sped up past the
			// throttling point: the backend has not recovered, and the
			// limit goes back to about where the climb sped up (it was
			// not throttled there for a while), not further.
			cut = math.Min(cut, math.Floor(accelCutBack*c.accelFrom))
		}
		if c.slowStart || toServed {
			c.drainCut, c.drainOld, c.drainServed = now, 0, toServed
		}
		floorRate := c.deliveredRate(delivered)
		c.lastCut, c.cutAt, c.slowStart, c.accelFrom, c.servedSinceCut = now, c.limit, false, 0, 0
		// The answers of the next period come from calls started
		// under the old limit.
		c.settling = true
		c.floor, c.shrunk, c.grew = 0, rateCheck{}, rateCheck{}
		c.setLimit(cut, ReasonThrottled)
		if toServed {
			c.floor, c.floorRate = c.limit, floorRate
		}
		if c.probing {
			c.cutAt = c.probeSaved
			c.probeSaved = math.Max(float64(c.cfg.Min), math.Floor(c.probeSaved*c.cfg.Backoff))
		}
		return
	}
	latency = max(latency, time.Microsecond)
	// After this answer is judged: if it was the last call in flight,
	// the next burst starts no more calls at once than the request
	// limit let through.
	defer c.capIdle(inFlight)
	c.served = append(c.served, servedAt{now, c.limit})
	c.servedSinceCut++
	c.deliveredLocked(now) // forgets the answers older than two periods
	if c.probe(now, latency) {
		return
	}
	if c.slowStart {
		c.slowStartSample(now, latency, inFlight)
	}
	gap := !c.lastSample.IsZero() && c.lastPeriod > 0 && now.Sub(c.lastSample) > idleGapPeriods*c.lastPeriod
	if gap || !c.idleAt.IsZero() && !now.Add(-latency).Before(c.idleAt) {
		// The backend was idle (no answer for a while, or the call
		// started after an answer left none in flight): the answers
		// to come are a new burst's. bench-peers' bursts come 0.1 to
		// 2 s apart, less than three of slow-cloud's periods: by the
		// gap alone, fast-san's burst was judged in slow-cloud's 3 s
		// period and never grew.
		c.warmup, c.sum, c.n, c.busiest, c.periodEnd = true, 0, 0, 0, time.Time{}
		c.shrunk, c.grew = rateCheck{}, rateCheck{}
	}
	c.lastSample = now
	c.idleAt = time.Time{}
	if inFlight <= 1 {
		c.idleAt = now
	}
	c.sum += latency
	c.n++
	if !c.drainCut.IsZero() && now.Add(-latency).Before(c.drainCut) {
		c.drainOld++
	}
	c.busiest = max(c.busiest, inFlight)
	if c.periodEnd.IsZero() {
		c.periodStart, c.periodEnd, c.lastPeriod = now.Add(-latency), now.Add(latency), latency
	}
	if now.Before(c.periodEnd) || c.n < minPeriodSamples {
		return
	}
	mean := c.sum / time.Duration(c.n)
	inUse := float64(c.busiest) >= c.limit/2
	// The delivered rate: answers served per second over the period.
	rate := float64(c.n) / max(now.Sub(c.periodStart), time.Microsecond).Seconds()
	n, old := c.n, c.drainOld
	c.sum, c.n, c.busiest, c.lastPeriod, c.periodStart, c.periodEnd, c.drainOld = 0, 0, 0, mean, now, now.Add(mean), 0
	if c.warmup {
		// The first answers of a burst are its fastest calls (they all
		// started together): their mean is below the backend's, and as
		// a baseline it would make every later period look queued.
		// The period sets the period length only, and tells whether
		// the burst is against another backend than the one the limit
		// learned (its latency regimeRatio × faster or slower).
		c.warmup = false
		if base := c.Baseline(); base > 0 && (regimeRatio*mean < base || mean > regimeRatio*base) {
			c.newBackend(mean < base)
		}
		c.idleFrom = 0
		return
	}
	if !c.drainCut.IsZero() {
		if 2*old > n || c.drainServed && drainServedShare*old > n {
			// Most answers still come from calls started before the
			// last cut: their latency is the queue's the cut drains.
			c.settling = false
			return
		}
		c.drainCut, c.drainServed = time.Time{}, false
	}
	// The baseline takes the period means smoothed over a few periods: the
	// minimum of raw means would follow their noise (a few calls per
	// period on a slow backend) instead of the backend.
	c.smoothed.add(float64(mean))
	base := c.baseline.add(now, time.Duration(c.smoothed.value))
	if c.limit <= float64(c.cfg.Min) {
		// At the floor the latency is the backend's own: it is the
		// baseline, whatever came before (the backend got slower).
		base = c.baseline.reset(now, time.Duration(c.smoothed.value))
	}
	if c.settling {
		// This period's calls started under the limit before the last
		// change: they cannot show its effect yet.
		c.settling = false
		return
	}
	before := c.limit
	defer func() { c.settling, c.prevRate = c.limit != before, rate }()
	if shrunk := c.shrunk; shrunk.pending {
		c.shrunk.pending = false
		if f := c.limit / shrunk.limit; f < 1 && rate < shrunk.rate*(1+f)/2 && float64(mean) > 1.1*f*float64(shrunk.mean) {
			// The delivered rate fell with the limit (by more than half
			// as much): the latency was not calls queueing behind ours
			// (those would have been served as fast with fewer in
			// flight) but the backend's or the host's own, and the cut
			// cost throughput. Back to the limit before it, whose
			// latency is the baseline now, and no latency cut below it
			// while it delivers its rate.
			c.floor, c.floorRate = shrunk.limit, shrunk.rate
			c.baseline.reset(now, shrunk.mean)
			c.shrinkFrom = 0
			c.setLimit(shrunk.limit, ReasonRateFell)
			c.restartSlowStart()
			return
		}
	}
	if grew := c.grew; grew.pending {
		c.grew.pending = false
		if g := c.limit / grew.limit; g > 1 && float64(mean) >= c.cfg.Grow*float64(base) && rate >= grew.rate*(1+0.75*(g-1)) {
			// The latency rose, but the delivered rate grew with the
			// limit: the backend is not queueing our calls (a queue
			// serves no faster with more of them waiting); the latency
			// is the host's or the backend's own. It is the baseline.
			base = c.baseline.reset(now, time.Duration(c.smoothed.value))
		}
	}
	ratio := float64(mean) / float64(base)
	if ratio < c.cfg.Grow {
		c.shrinkFrom = 0
	}
	if c.floor > 0 && rate < 0.8*c.floorRate {
		// The floor no longer delivers its rate: the backend changed.
		c.floor = 0
	}
	switch {
	case ratio > c.cfg.Shrink:
		if c.shrinkFrom == 0 {
			c.shrinkFrom, c.shrinkMean = c.limit, mean
		}
		next := c.limit * math.Max(0.5, c.cfg.Grow/ratio)
		if c.floor > 0 {
			next = math.Max(next, math.Min(c.floor, c.limit))
		}
		if next >= c.limit {
			break
		}
		if next < c.shrinkFrom/2 && float64(mean) >= 0.9*float64(c.shrinkMean) {
			// The limit would come down past half of where the latency
			// first shrank it, and the latency has not come down with
			// it: it is not our calls queueing, the baseline is too low
			// (a lucky probe, the fastest answers of a burst, or the
			// backend got slower for everyone). The latency now is the
			// baseline, and the limit finds the backend's pace again as
			// fast as at the start.
			c.baseline.reset(now, time.Duration(c.smoothed.value))
			c.shrinkFrom = 0
			c.restartSlowStart()
			break
		}
		c.shrunk = rateCheck{limit: c.limit, rate: math.Max(rate, c.prevRate), mean: mean, pending: true}
		c.setLimit(next, ReasonLatencyRose)
		c.drainCut, c.drainOld, c.drainServed = now, 0, false
	case ratio < c.cfg.Grow && inUse && !c.slowStart:
		step := math.Sqrt(c.limit)
		if c.cutAt > 0 && c.limit+step > c.creepFrom() && c.limit < c.cutAt*1.3 {
			// Near where the backend throttled last: creep.
			step = math.Min(step, c.creep(now, step))
		}
		c.grew = rateCheck{limit: c.limit, rate: math.Max(rate, c.prevRate), pending: true}
		c.setLimit(c.limit+step, ReasonLatencyFlat)
	}
}

// A burst whose first period's mean latency is regimeRatio × below or
// above the baseline is against another backend (or the backend changed);
// after a throttled cut to the answers served, a period is judged once at
// most 1/drainServedShare of its answers come from calls started before
// it.
const (
	regimeRatio      = 4
	drainServedShare = 8
)

// newBackend forgets what the limit learned of the backend before a burst
// whose first answers are regimeRatio × faster or slower: its baseline
// (judged against fast-san's 20 ms, throttling-api's 200 ms calls looked
// queued ten times over), where it throttled and the start cap (kept, the
// throttling point of slow-cloud's request limit would slow fast-san's
// climb to a creep). A faster backend gets back the limit the idle cap took, and slow start
// begins again: on bench-peers' fast-san burst after slow-cloud, the limit
// grew from 8-30 at √limit per two 20 ms periods, reaching about a third
// of the capacity over the burst.
func (c *Control) newBackend(faster bool) {
	c.cutAt, c.point, c.startCap, c.cycle, c.accelFrom, c.lastCut = 0, 0, 0, ewma{alpha: 0.3}, 0, time.Time{}
	c.floor, c.shrinkFrom, c.shrunk, c.grew = 0, 0, rateCheck{}, rateCheck{}
	c.baseline.entries, c.smoothed = c.baseline.entries[:0], ewma{alpha: 0.3}
	if !faster {
		return
	}
	if c.idleFrom > c.limit {
		c.setLimit(c.idleFrom, ReasonNewBackend)
	}
	c.restartSlowStart()
}

// capIdle brings the limit down to startCap when an answer leaves no call
// in flight (inFlight counts the answer's own call), after the answer was
// judged: a period that ended with it and undid a latency cut took the
// limit back above the cap (24 over 16), and the next burst started 24
// calls into a bucket of 20. With no request limit learned (no startCap),
// the next burst begins with slow start from Initial, as TCP restarts
// from its initial window after an idle time: a limit the answers of a
// fast backend took to its bound started a slow backend's whole burst at
// once (bench-peers' slow-cloud burst after its latency workloads: 100
// calls into a bucket of 20, 27 % of the calls throttled in simulation,
// 9 % in the bench). A burst against a backend as fast as the last one
// doubles back within a few of its round trips; one against a backend
// regimeRatio × faster gets the limit back at once (newBackend).
func (c *Control) capIdle(inFlight int) {
	if inFlight > 1 {
		return
	}
	if c.startCap > 0 && c.limit > c.startCap {
		c.idleFrom = c.limit
		c.setLimit(c.startCap, ReasonIdleCap)
		return
	}
	if c.startCap == 0 && c.limit > float64(c.cfg.Initial) {
		c.idleFrom = c.limit
		c.setLimit(float64(c.cfg.Initial), ReasonIdleRestart)
		c.restartSlowStart()
	}
}

// servedWithinBaseline is how many answers were served within the
// baseline latency before now (within the last period when that is
// shorter, or no baseline is known): the calls the backend serves at
// once at its own latency.
func (c *Control) servedWithinBaseline(now time.Time) float64 {
	w := c.lastPeriod
	if b := c.Baseline(); b > 0 {
		w = min(w, b)
	}
	return float64(c.servedWithin(now, w))
}

// rateCheck is a change of the limit that the first period after it
// judges by the rate the backend delivered.
type rateCheck struct {
	limit, rate float64
	mean        time.Duration
	pending     bool
}

// Near a throttling point the limit creeps (creepStep of itself per
// judged period) and speeds up, doubling its creep every two periods,
// once no throttled answer came for accelWaitPeriods or accelWaitCycles
// × the usual time between throttled cuts, whichever is longer; a
// throttled answer that ends such a climb cuts to at most accelCutBack ×
// the limit where it sped up.
const (
	creepStep        = 0.05
	accelWaitPeriods = 10
	accelWaitCycles  = 0.75
	accelCutBack     = 1.1
)

// creepFrom is where growth slows to a creep below a throttling point:
// 0.9 × the limit the backend last throttled, or the concurrency its
// request limit was seen to sustain when that is lower (the limit that
// was throttled can be well above it: the request limit's bucket let
// the calls through for a while before it ran dry).
func (c *Control) creepFrom() float64 {
	from := 0.9 * c.cutAt
	if c.point > 0 {
		from = math.Min(from, c.point)
	}
	return from
}

// creep is the growth of a judged period near a throttling point (at most
// step). It is creepStep of the limit while throttled answers are as
// recent as usual, and it doubles every two periods once they are not:
// the backend may have recovered (a request limit raised, a degraded
// phase over), and a creep of 5 % per judged period from a limit cut to
// a quarter of the new capacity took 5 to 10 seconds to get back.
func (c *Control) creep(now time.Time, step float64) float64 {
	creep := math.Max(0.1*step, creepStep*c.limit)
	wait := math.Max(accelWaitPeriods*float64(c.lastPeriod), accelWaitCycles*c.cycle.value)
	if since := float64(now.Sub(c.lastCut)); c.lastPeriod > 0 && since > wait {
		if c.accelFrom == 0 {
			c.accelFrom = c.limit
		}
		creep *= math.Pow(2, (since-wait)/float64(2*c.lastPeriod))
	}
	return creep
}

// learnPoint takes a throttled answer that cuts the limit: the time since
// the last cut feeds the usual time between cuts, and the answers served
// since it (when at least three periods ago) show the request rate the
// backend lets through, its bucket empty at both cuts; at the period's
// latency that rate is the concurrency it sustains (point). Without a
// new estimate the last one stays; either way it is no more than the
// limit throttled now.
func (c *Control) learnPoint(now time.Time) {
	point := c.limit
	if !c.lastCut.IsZero() && c.lastPeriod > 0 {
		since := now.Sub(c.lastCut)
		c.cycle.add(float64(since))
		if since >= 3*c.lastPeriod {
			rate := float64(c.servedSinceCut) / since.Seconds()
			point = math.Min(point, math.Max(float64(c.cfg.Min), rate*c.lastPeriod.Seconds()))
		} else if c.point > 0 {
			point = math.Min(point, c.point)
		}
	}
	c.point = point
}

// slowStartSample grows the limit by one for a served answer while the
// limit is in use and the answers' running mean stays below Grow × the
// lowest running mean seen; above it the backend queues our calls, and
// slow start ends (the periods take over from there).
func (c *Control) slowStartSample(now time.Time, latency time.Duration, inFlight int) {
	c.ssMean.add(float64(latency))
	c.ssN++
	// The first round trip's answers are its fastest calls: the lowest
	// running mean is taken from the second on.
	if c.ssN >= max(slowStartSamples, 2*c.cfg.Initial) {
		if c.ssBase == 0 || c.ssMean.value < c.ssBase {
			c.ssBase = c.ssMean.value
		}
		if c.ssMean.value > c.cfg.Grow*c.ssBase {
			c.slowStart = false
			if bdp, ok := c.fullPipe(now); ok && bdp < c.limit {
				// Never below half: a host's load can raise the latency
				// as the limit reaches the rate's knee (the saturated
				// bench burst), and there more in flight still serves a
				// little faster.
				bdp = math.Max(bdp, math.Ceil(c.limit/2))
				c.settling, c.drainCut, c.drainOld, c.drainServed = true, now, 0, false
				c.setLimit(bdp, ReasonSlowStartEnd)
				// As after a throttled cut to the answers served: no
				// latency cut below it while they hold (on slow-cloud the
				// queue slow start left cut 19 to 15).
				c.floor, c.floorRate = c.limit, c.deliveredRate(c.deliveredLocked(now))
			}
			return
		}
	}
	if float64(inFlight) >= c.limit/2 {
		c.setLimit(c.limit+1, ReasonSlowStart)
	}
}

// restartSlowStart starts slow start again.
func (c *Control) restartSlowStart() {
	c.slowStart, c.ssMean, c.ssBase, c.ssN = true, ewma{alpha: slowStartAlpha}, 0, 0
}

// fullPipe tells whether slow start, ending on a latency rise, filled
// the backend: in the last period the limit grew by at least Grow ×
// while the answers served grew by less than Grow × those of the period
// before (BBR's startup ends the same way, when the delivered rate stops
// growing). It returns the concurrency the backend serves without
// queueing then: Grow × the answers served per second × the baseline
// latency (slow start's lowest running mean). The latency shows the
// queue one round trip late, by when slow start has doubled the limit:
// on slow-cloud's 2 s backend of 16 at once it reached 36 to 47.
func (c *Control) fullPipe(now time.Time) (float64, bool) {
	if c.lastPeriod <= 0 || c.ssBase <= 0 {
		return 0, false
	}
	recent := c.deliveredLocked(now)
	older := len(c.served) - recent
	if recent < minPeriodSamples || older < minPeriodSamples || float64(recent) >= c.cfg.Grow*float64(older) {
		return 0, false
	}
	if then := c.served[older].limit; c.limit < c.cfg.Grow*then {
		return 0, false
	}
	rate := float64(recent) / c.lastPeriod.Seconds()
	bdp := math.Ceil(c.cfg.Grow * rate * time.Duration(c.ssBase).Seconds())
	return bdp, bdp >= minPeriodSamples
}

// servedAt is a served answer: when it came, and the limit then.
type servedAt struct {
	at    time.Time
	limit float64
}

// deliveredLocked is how many answers were served within the last
// period before now (and forgets those older than two periods).
func (c *Control) deliveredLocked(now time.Time) int {
	return c.servedWithin(now, c.lastPeriod)
}

// servedWithin is how many answers were served within w before now (w at
// most two periods), after forgetting those older than two periods.
func (c *Control) servedWithin(now time.Time, w time.Duration) int {
	i := 0
	for i < len(c.served) && now.Sub(c.served[i].at) > 2*c.lastPeriod {
		i++
	}
	c.served = append(c.served[:0], c.served[i:]...)
	for i = 0; i < len(c.served) && now.Sub(c.served[i].at) > w; i++ {
	}
	return len(c.served) - i
}

// deliveredRate is answers delivered over the last period, per second.
func (c *Control) deliveredRate(delivered int) float64 {
	return float64(delivered) / max(c.lastPeriod, time.Microsecond).Seconds()
}

// probe measures the baseline again, once every half BaselineWindow:
// under a load that never lets up the lowest period latency would only
// ever be a loaded one, and the baseline would creep up with the limit.
// The probe halves the limit for three periods; the calls that start in
// its first period run at half the load, and their mean latency (taken
// once all of them can have answered, so that the slow ones count too)
// becomes the baseline. Then the limit is restored. It reports whether the
// sample belonged to the probe.
func (c *Control) probe(now time.Time, latency time.Duration) bool {
	if c.lastProbe.IsZero() {
		c.lastProbe = now
	}
	if !c.probing {
		if c.slowStart || c.lastPeriod <= 0 || now.Sub(c.lastProbe) < c.cfg.BaselineWindow/2 {
			return false
		}
		c.probing, c.probeStart, c.probePeriod, c.probeSaved, c.probeSum, c.probeN = true, now, c.lastPeriod, c.limit, 0, 0
		c.setLimit(c.limit/2, ReasonProbe)
		return true
	}
	if started := now.Add(-latency); !started.Before(c.probeStart) && started.Before(c.probeStart.Add(c.probePeriod)) {
		c.probeSum += latency
		c.probeN++
	}
	if now.Sub(c.probeStart) < 3*c.probePeriod {
		return true
	}
	if c.probeN >= 3 {
		// The probe's mean replaces the baseline.
		c.baseline.reset(now, c.probeSum/time.Duration(c.probeN))
	}
	c.probing, c.lastProbe = false, now
	c.setLimit(c.probeSaved, ReasonProbeDone)
	c.sum, c.n, c.busiest, c.periodStart, c.periodEnd = 0, 0, 0, now, now.Add(c.lastPeriod)
	c.shrunk, c.grew = rateCheck{}, rateCheck{}
	// The next period's calls started under the probe's half limit: it
	// is not judged, and its rate is no reference for a growth's rate
	// check (judged against it, a growth past the backend's capacity
	// passed for one the backend kept pace with, and its queued latency
	// became the baseline: the limit rose to 120-162 on 64).
	c.settling, c.prevRate = true, 0
	return true
}

// Why the limit last changed (Control.Reason).
const (
	ReasonSlowStart    = "slow start: answers served while the limit is in use"
	ReasonSlowStartEnd = "slow start ended on a latency rise with the answers served per second no longer growing: back to what they fill at the baseline latency"
	ReasonLatencyFlat  = "latency flat while the limit is in use"
	ReasonLatencyRose  = "latency rose above the shrink factor × the baseline: the backend queues calls"
	ReasonThrottled    = "the backend throttled a call"
	ReasonRateFell     = "the answers served per second fell with the last latency cut: the latency is not the backend queueing calls"
	ReasonProbe        = "baseline probe: half the limit for three periods"
	ReasonProbeDone    = "baseline probe over"
	ReasonIdleRestart  = "the backend is idle: the next burst begins with slow start from the initial limit"
	ReasonIdleCap      = "the backend is idle: the next burst starts no more calls at once than its request limit let through"
	ReasonNewBackend   = "a burst's first answers came much faster than the baseline: another backend, slow start again from the limit before the idle cap"
)

func (c *Control) setLimit(l float64, reason string) {
	c.limit = math.Max(float64(c.cfg.Min), math.Min(float64(c.cfg.Max), l))
	c.reason = reason
}

// Reason says why the limit last changed (one of the Reason constants;
// empty before the first change).
func (c *Control) Reason() string { return c.reason }

// Baseline is the latency the limit judges periods against: the backend's
// own latency when it is not queueing our calls (0 before the first
// period).
func (c *Control) Baseline() time.Duration {
	if len(c.baseline.entries) == 0 {
		return 0
	}
	return c.baseline.entries[0].v
}

// windowMin is the minimum of the values added within the last window.
type windowMin struct {
	window time.Duration
	// entries hold increasing values with increasing times: the first is
	// the minimum.
	entries []timedValue
}

type timedValue struct {
	at time.Time
	v  time.Duration
}

func (w *windowMin) add(now time.Time, v time.Duration) time.Duration {
	for len(w.entries) > 0 && w.entries[len(w.entries)-1].v >= v {
		w.entries = w.entries[:len(w.entries)-1]
	}
	w.entries = append(w.entries, timedValue{now, v})
	for now.Sub(w.entries[0].at) > w.window {
		w.entries = w.entries[1:]
	}
	return w.entries[0].v
}

func (w *windowMin) reset(now time.Time, v time.Duration) time.Duration {
	w.entries = append(w.entries[:0], timedValue{now, v})
	return v
}

// ewma is an exponentially weighted moving average.
type ewma struct {
	alpha float64
	value float64
	set   bool
}

func (e *ewma) add(x float64) {
	if !e.set {
		e.value, e.set = x, true
		return
	}
	e.value += e.alpha * (x - e.value)
}
