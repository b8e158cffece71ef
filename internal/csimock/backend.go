package csimock

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/utils/clock"
	"sigs.k8s.io/yaml"
)

// Backend models the storage system behind the driver's controller calls:
// how long a ControllerPublishVolume or ControllerUnpublishVolume takes,
// how many the backend serves at once, and how many its API accepts per
// second. Without one the driver answers at once, with unlimited
// capacity. Profiles names the built-in ones.
//
// The model, per call:
//  1. The API's request limit (a token bucket of Rate tokens per second,
//     Burst deep): a call with no token left fails at once with
//     ThrottleCode and a cloud's wording ("Request limit exceeded"), as
//     drivers pass their cloud's throttling through. A throttled call
//     does nothing to the volume.
//  2. The latency: a sample of a log-normal distribution with median
//     Latency and σ Spread. While more than Capacity calls run, each new
//     call's latency grows by inFlight/Capacity (the backend shares its
//     capacity: the throughput stays Capacity/Latency operations per
//     second, and latency grows with the load beyond it).
//  3. The call itself (the driver's state change), after the latency.
//
// Phases change Capacity and the request limit during a run (a backend
// that degrades and recovers), counted from when the backend was set.
type Backend struct {
	// Profile is the name of the profile this backend was made from;
	// empty for one described field by field.
	Profile string `json:"profile,omitempty"`
	// Latency is the median duration of one operation at or below
	// Capacity.
	Latency Duration `json:"latency"`
	// Spread is the σ of the log-normal latency distribution (0: every
	// operation takes Latency).
	Spread float64 `json:"spread,omitempty"`
	// Capacity is how many operations run at once at Latency; 0 is
	// unlimited.
	Capacity int `json:"capacity,omitempty"`
	// Rate is the request limit in calls per second; 0 is none.
	Rate float64 `json:"rate,omitempty"`
	// Burst is the depth of the request limit's bucket; 0 means one
	// second's worth of Rate (at least 1).
	Burst int `json:"burst,omitempty"`
	// ThrottleCode is the gRPC code of a throttled call:
	// ResourceExhausted (the default) or Unavailable.
	ThrottleCode Code `json:"throttleCode,omitempty"`
	// Phases change Capacity, Rate and Burst from their After on, in
	// order.
	Phases []BackendPhase `json:"phases,omitempty"`
	// Seed seeds the latency samples (0: the driver's seed, Config.Seed):
	// the same seed gives the same sequence of samples, another seed
	// another draw of the same distribution.
	Seed uint64 `json:"seed,omitempty"`
}

// BackendPhase is a change of a backend's limits during a run.
type BackendPhase struct {
	// After is counted from when the backend was set.
	After    Duration `json:"after"`
	Capacity int      `json:"capacity,omitempty"`
	Rate     float64  `json:"rate,omitempty"`
	Burst    int      `json:"burst,omitempty"`
}

// ThrottledMessage is what a throttled call answers, as AWS words its
// RequestLimitExceeded (drivers pass it through).
const ThrottledMessage = "Request limit exceeded: the storage API throttled this request; retry later"

// Profiles are the built-in backends by name.
//
//   - slow-cloud: a cloud block-storage API, seconds per attach and a tight
//     request limit: 2 s median (σ 0.3), 16 at once (8 operations per
//     second), 10 calls per second with a burst of 20, throttled calls
//     ResourceExhausted.
//   - fast-san: a SAN in the data center, 20 ms median (σ 0.2), 64 at once
//     (3,200 operations per second), no request limit.
//   - throttling-api: 200 ms median (σ 0.25), 40 at once (200 per second),
//     100 calls per second; after 20 s it drops to 10 at once and 25 calls
//     per second (50 operations per second), after 40 s it is back; its
//     throttled calls are Unavailable.
func Profiles() map[string]Backend {
	return map[string]Backend{
		"slow-cloud": {Profile: "slow-cloud", Latency: Duration(2 * time.Second), Spread: 0.3, Capacity: 16,
			Rate: 10, Burst: 20, ThrottleCode: Code(codes.ResourceExhausted)},
		"fast-san": {Profile: "fast-san", Latency: Duration(20 * time.Millisecond), Spread: 0.2, Capacity: 64},
		"throttling-api": {Profile: "throttling-api", Latency: Duration(200 * time.Millisecond), Spread: 0.25, Capacity: 40,
			Rate: 100, Burst: 100, ThrottleCode: Code(codes.Unavailable),
			Phases: []BackendPhase{
				{After: Duration(20 * time.Second), Capacity: 10, Rate: 25, Burst: 25},
				{After: Duration(40 * time.Second), Capacity: 40, Rate: 100, Burst: 100},
			}},
	}
}

// ProfileNames returns the built-in profiles' names, sorted.
func ProfileNames() []string {
	var names []string
	for n := range Profiles() {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// ProfileBackend returns the built-in profile name.
func ProfileBackend(name string) (Backend, error) {
	b, ok := Profiles()[name]
	if !ok {
		return Backend{}, fmt.Errorf("unknown backend profile %q (known: %s)", name, strings.Join(ProfileNames(), ", "))
	}
	return b, nil
}

func (b *Backend) validate() error {
	switch {
	case b.Latency < 0:
		return fmt.Errorf("backend latency must not be negative, got %s", time.Duration(b.Latency))
	case b.Spread < 0 || b.Spread > 3:
		return fmt.Errorf("backend spread must be between 0 and 3, got %v", b.Spread)
	case b.Capacity < 0:
		return fmt.Errorf("backend capacity must not be negative, got %d", b.Capacity)
	case b.Rate < 0 || b.Burst < 0:
		return fmt.Errorf("backend rate and burst must not be negative, got %v and %d", b.Rate, b.Burst)
	}
	switch codes.Code(b.ThrottleCode) {
	case codes.OK, codes.ResourceExhausted, codes.Unavailable:
	default:
		return fmt.Errorf("backend throttle code must be ResourceExhausted or Unavailable, got %s", codes.Code(b.ThrottleCode))
	}
	for i, p := range b.Phases {
		if p.After < 0 || p.Capacity < 0 || p.Rate < 0 || p.Burst < 0 {
			return fmt.Errorf("backend phase %d: values must not be negative", i)
		}
		if i > 0 && p.After < b.Phases[i-1].After {
			return fmt.Errorf("backend phase %d starts before phase %d", i, i-1)
		}
	}
	return nil
}

// BackendStats is what the backend model has seen since it was set.
type BackendStats struct {
	Profile string `json:"profile,omitempty"`
	// Capacity and Rate are the limits in force now (after phases).
	Capacity int     `json:"capacity"`
	Rate     float64 `json:"rate"`
	// OpsPerSecond is the throughput the backend can serve now:
	// Capacity over the mean latency (the median Latency × e^(σ²/2)),
	// and no more than Rate (0 when unlimited).
	OpsPerSecond float64 `json:"opsPerSecond"`
	InFlight     int     `json:"inFlight"`
	MaxInFlight  int     `json:"maxInFlight"`
	// Served counts the operations that ran (whatever their outcome);
	// Throttled the calls refused by the request limit.
	Served    int64 `json:"served"`
	Throttled int64 `json:"throttled"`
}

// backendModel is a Backend at work; mu guards everything.
type backendModel struct {
	mu     sync.Mutex
	cfg    Backend
	clock  clock.PassiveClock
	start  time.Time
	rng    *rand.Rand
	tokens float64
	filled time.Time
	phase  int // phases in force: cfg.Phases[:phase]
	stats  BackendStats
}

func newBackendModel(b Backend, clk clock.PassiveClock, seed uint64) *backendModel {
	now := clk.Now()
	m := &backendModel{cfg: b, clock: clk, start: now, filled: now,
		rng: rand.New(rand.NewPCG(seed, 0x6261636b656e64))}
	m.stats.Profile = b.Profile
	m.tokens = float64(m.burstLocked())
	return m
}

// limitsLocked applies the phases that have begun by now.
func (m *backendModel) limitsLocked(now time.Time) {
	for m.phase < len(m.cfg.Phases) && !now.Before(m.start.Add(time.Duration(m.cfg.Phases[m.phase].After))) {
		m.refillLocked(now) // tokens earned at the old rate stay
		p := m.cfg.Phases[m.phase]
		m.cfg.Capacity, m.cfg.Rate, m.cfg.Burst = p.Capacity, p.Rate, p.Burst
		m.tokens = math.Min(m.tokens, float64(m.burstLocked()))
		m.phase++
	}
}

func (m *backendModel) burstLocked() int {
	if m.cfg.Burst > 0 {
		return m.cfg.Burst
	}
	return max(1, int(math.Ceil(m.cfg.Rate)))
}

func (m *backendModel) refillLocked(now time.Time) {
	if m.cfg.Rate > 0 {
		m.tokens = math.Min(float64(m.burstLocked()), m.tokens+now.Sub(m.filled).Seconds()*m.cfg.Rate)
	}
	m.filled = now
}

// admit takes a call in: a throttling error, or the latency the call
// waits before it runs and the function that ends it.
func (m *backendModel) admit() (time.Duration, func(), error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock.Now()
	m.limitsLocked(now)
	if m.cfg.Rate > 0 {
		m.refillLocked(now)
		if m.tokens < 1 {
			m.stats.Throttled++
			code := codes.Code(m.cfg.ThrottleCode)
			if code == codes.OK {
				code = codes.ResourceExhausted
			}
			return 0, nil, status.Error(code, ThrottledMessage)
		}
		m.tokens--
	}
	m.stats.InFlight++
	m.stats.MaxInFlight = max(m.stats.MaxInFlight, m.stats.InFlight)
	m.stats.Served++
	latency := float64(m.cfg.Latency)
	if m.cfg.Spread > 0 {
		latency *= math.Exp(m.cfg.Spread * m.rng.NormFloat64())
	}
	if c := m.cfg.Capacity; c > 0 && m.stats.InFlight > c {
		latency *= float64(m.stats.InFlight) / float64(c)
	}
	done := sync.OnceFunc(func() {
		m.mu.Lock()
		m.stats.InFlight--
		m.mu.Unlock()
	})
	return time.Duration(latency), done, nil
}

func (m *backendModel) snapshot() BackendStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.limitsLocked(m.clock.Now())
	s := m.stats
	s.Capacity, s.Rate = m.cfg.Capacity, m.cfg.Rate
	if m.cfg.Capacity > 0 && m.cfg.Latency > 0 {
		// The mean of the log-normal latency is the median × e^(σ²/2):
		// Capacity calls at once complete Capacity per mean latency.
		mean := time.Duration(m.cfg.Latency).Seconds() * math.Exp(m.cfg.Spread*m.cfg.Spread/2)
		s.OpsPerSecond = float64(m.cfg.Capacity) / mean
	}
	if m.cfg.Rate > 0 && (s.OpsPerSecond == 0 || m.cfg.Rate < s.OpsPerSecond) {
		s.OpsPerSecond = m.cfg.Rate
	}
	return s
}

// backendMethods are the calls the backend model serves: the attacher's.
var backendMethods = []string{"ControllerPublishVolume", "ControllerUnpublishVolume"}

// throughBackend runs call through the backend model, when one is set and
// the method is one it serves: throttled at once, or run after its
// latency. Waiting ends early when the caller gives up or the instance
// goes down.
func (d *Driver) throughBackend(ctx context.Context, inst instance, method string, call func() (any, error)) (any, error) {
	m := d.backend.Load()
	if m == nil || !slices.Contains(backendMethods, method) {
		return call()
	}
	latency, done, err := m.admit()
	if err != nil {
		return nil, err
	}
	defer done()
	if latency > 0 {
		t := d.clock.NewTimer(latency)
		select {
		case <-t.C():
		case <-ctx.Done():
			t.Stop()
			return nil, status.FromContextError(ctx.Err()).Err()
		case <-inst.down:
			t.Stop()
			return nil, errCrashed
		}
	}
	return call()
}

// SetBackend replaces the backend model (nil: none; answers at once); its
// phases and counters start now.
func (d *Driver) SetBackend(b *Backend) error {
	if b == nil {
		d.backend.Store(nil)
		return nil
	}
	if err := b.validate(); err != nil {
		return err
	}
	cp := *b
	cp.Phases = slices.Clone(b.Phases)
	seed := d.cfg.Seed
	if b.Seed != 0 {
		seed = b.Seed
	}
	d.backend.Store(newBackendModel(cp, d.clock, seed))
	return nil
}

// BackendStats returns the backend model's counters; false when none is
// set.
func (d *Driver) BackendStats() (BackendStats, bool) {
	m := d.backend.Load()
	if m == nil {
		return BackendStats{}, false
	}
	return m.snapshot(), true
}

// Duration is a time.Duration written as a Go duration string ("2s") in
// JSON and YAML.
type Duration time.Duration

// MarshalJSON writes the duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads a duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string such as \"250ms\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// Code is a gRPC code written by name in JSON and YAML (either spelling,
// or its number; see ParseCode).
type Code codes.Code

// MarshalJSON writes the code's name.
func (c Code) MarshalJSON() ([]byte, error) { return json.Marshal(codes.Code(c).String()) }

// UnmarshalJSON reads a code by name or number.
func (c *Code) UnmarshalJSON(b []byte) error {
	v, err := parseCode(b)
	if err != nil {
		return err
	}
	*c = Code(v)
	return nil
}

// ParseBackend reads a backend from JSON or YAML: {"profile": NAME} alone
// for a built-in profile, else every field of Backend (Profile then only
// names it). It is validated.
func ParseBackend(data []byte) (Backend, error) {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return Backend{}, fmt.Errorf("parse backend: %w", err)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(js, &fields); err != nil {
		return Backend{}, fmt.Errorf("parse backend: %w", err)
	}
	var b Backend
	if err := strictUnmarshal(js, &b); err != nil {
		return Backend{}, fmt.Errorf("parse backend: %w", err)
	}
	if _, only := fields["profile"]; only && len(fields) == 1 {
		return ProfileBackend(b.Profile)
	}
	if err := b.validate(); err != nil {
		return Backend{}, err
	}
	return b, nil
}
