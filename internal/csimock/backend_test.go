package csimock

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/latchcsi/latch/internal/csi/csitest"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// admitN admits n calls and returns their latencies and the errors of
// the throttled ones (nil entries for those admitted).
func admitN(m *backendModel, n int) ([]time.Duration, []error) {
	var lat []time.Duration
	var errs []error
	for range n {
		l, _, err := m.admit()
		lat = append(lat, l)
		errs = append(errs, err)
	}
	return lat, errs
}

// The request limit: a full bucket lets Burst calls through at once, the
// rest fail at once with the throttle code and the cloud's wording; the
// bucket refills at Rate, never beyond Burst.
func TestBackendRequestLimitThrottlesBeyondTheBucketAndRefillsAtRate(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	m := newBackendModel(Backend{Latency: Duration(time.Second), Rate: 5, Burst: 10, ThrottleCode: Code(codes.Unavailable)}, clk, 1)
	_, errs := admitN(m, 12)
	for i, err := range errs {
		switch {
		case i < 10 && err != nil:
			t.Fatalf("call %d of a full bucket throttled: %v", i, err)
		case i >= 10 && (status.Code(err) != codes.Unavailable || status.Convert(err).Message() != ThrottledMessage):
			t.Fatalf("call %d beyond the burst = %v, want Unavailable %q", i, err, ThrottledMessage)
		}
	}
	clk.Step(time.Second) // 5 tokens
	_, errs = admitN(m, 6)
	if throttled := countErrs(errs); throttled != 1 {
		t.Errorf("after 1 s at 5/s: %d of 6 throttled, want 1", throttled)
	}
	clk.Step(time.Hour) // the bucket holds Burst, not an hour's worth
	_, errs = admitN(m, 11)
	if throttled := countErrs(errs); throttled != 1 {
		t.Errorf("after an hour: %d of 11 throttled, want 1 (burst 10)", throttled)
	}
	s := m.snapshot()
	if s.Throttled != 4 || s.Served != 25 || s.InFlight != 25 || s.MaxInFlight != 25 {
		t.Errorf("stats = %+v, want 4 throttled, 25 served and in flight", s)
	}
}

func countErrs(errs []error) int {
	n := 0
	for _, err := range errs {
		if err != nil {
			n++
		}
	}
	return n
}

// Capacity: up to Capacity calls take Latency; each call beyond it takes
// Latency × inFlight/Capacity, so the throughput stays Capacity/Latency.
// A finished call frees its share.
func TestBackendLatencyGrowsWithTheLoadBeyondCapacity(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	m := newBackendModel(Backend{Latency: Duration(100 * time.Millisecond), Capacity: 4}, clk, 1)
	var dones []func()
	var lat []time.Duration
	for range 8 {
		l, done, err := m.admit()
		if err != nil {
			t.Fatal(err)
		}
		lat = append(lat, l)
		dones = append(dones, done)
	}
	want := []time.Duration{100, 100, 100, 100, 125, 150, 175, 200}
	for i := range want {
		if lat[i] != want[i]*time.Millisecond {
			t.Errorf("latency of call %d = %s, want %s", i+1, lat[i], want[i]*time.Millisecond)
		}
	}
	for _, done := range dones[:5] {
		done()
		done() // ending twice counts once
	}
	if l, _, _ := m.admit(); l != 100*time.Millisecond {
		t.Errorf("latency with 3 others in flight = %s, want 100ms", l)
	}
	if s := m.snapshot(); s.InFlight != 4 || s.MaxInFlight != 8 || s.OpsPerSecond != 40 {
		t.Errorf("stats = %+v, want 4 in flight, at most 8, 40 ops/s", s)
	}
}

// The latency is log-normal around its median, seeded: the same seed
// gives the same samples, about half of them below the median.
func TestBackendLatencySpreadIsSeededAroundTheMedian(t *testing.T) {
	b := Backend{Latency: Duration(time.Second), Spread: 0.5}
	a, _ := admitN(newBackendModel(b, clocktesting.NewFakeClock(t0), 7), 400)
	again, _ := admitN(newBackendModel(b, clocktesting.NewFakeClock(t0), 7), 400)
	other, _ := admitN(newBackendModel(b, clocktesting.NewFakeClock(t0), 8), 400)
	below := 0
	for i := range a {
		if a[i] != again[i] {
			t.Fatalf("sample %d differs with the same seed: %s vs %s", i, a[i], again[i])
		}
		if a[i] < time.Second {
			below++
		}
	}
	if below < 160 || below > 240 {
		t.Errorf("%d of 400 samples below the median, want about half", below)
	}
	if fmt.Sprint(a) == fmt.Sprint(other) {
		t.Error("another seed gave the same samples")
	}
}

// A backend set on the driver draws its latencies from its own seed, or
// from the driver's when it has none: bench-peers runs its profiles with
// another draw (--backend-seed) on the same driver.
func TestSetBackendSeedsTheLatenciesWithItsOwnSeedOrTheDrivers(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Seed = 5
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b := Backend{Latency: Duration(time.Second), Spread: 0.5}
	samples := func(seed uint64) string {
		b.Seed = seed
		if err := d.SetBackend(&b); err != nil {
			t.Fatal(err)
		}
		lat, _ := admitN(d.backend.Load(), 50)
		return fmt.Sprint(lat)
	}
	want := func(seed uint64) string {
		lat, _ := admitN(newBackendModel(b, clocktesting.NewFakeClock(t0), seed), 50)
		return fmt.Sprint(lat)
	}
	if got := samples(0); got != want(5) {
		t.Errorf("a backend without a seed drew %s, want the driver's seed's %s", got, want(5))
	}
	if got := samples(9); got != want(9) {
		t.Errorf("a backend seeded 9 drew %s, want %s", got, want(9))
	}
	if samples(9) == samples(0) {
		t.Error("the backend's seed and the driver's drew the same samples")
	}
}

// Phases change the limits at their time, and the stats show the limits
// in force.
func TestBackendPhasesChangeCapacityAndRateDuringTheRun(t *testing.T) {
	b, err := ProfileBackend("throttling-api")
	if err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakeClock(t0)
	m := newBackendModel(b, clk, 1)
	if s := m.snapshot(); s.Capacity != 40 || s.Rate != 100 || s.OpsPerSecond != 100 {
		t.Errorf("at start: %+v, want capacity 40, rate 100, 100 ops/s (the rate is below 40/200ms)", s)
	}
	clk.Step(20 * time.Second)
	if s := m.snapshot(); s.Capacity != 10 || s.Rate != 25 || s.OpsPerSecond != 25 {
		t.Errorf("after 20 s: %+v, want capacity 10, rate 25", s)
	}
	// The bucket is no deeper than the phase's burst.
	if _, errs := admitN(m, 30); countErrs(errs) != 5 {
		t.Errorf("after 20 s: %d of 30 throttled, want 5 (burst 25)", countErrs(errs))
	}
	clk.Step(20 * time.Second)
	if s := m.snapshot(); s.Capacity != 40 || s.Rate != 100 {
		t.Errorf("after 40 s: %+v, want capacity 40, rate 100 again", s)
	}
}

// Through gRPC: a throttled publish fails with the cloud's message and
// leaves the volume unpublished; an admitted one waits its latency and
// publishes. Calls other than publish and unpublish do not go through
// the backend.
func TestBackendThrottledPublishChangesNothingAndAdmittedOnesPublish(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Backend = &Backend{Latency: Duration(50 * time.Millisecond), Rate: 1, Burst: 3, ThrottleCode: Code(codes.ResourceExhausted)}
	e := newEnv(t, cfg)
	e.seed(t, "vol-0", "vol-1", "vol-2", "vol-3", "vol-4")
	codesSeen := make([]codes.Code, 5)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range 5 {
		wg.Go(func() {
			_, err := e.ctrl.ControllerPublishVolume(testCtx(t), pubReq(fmt.Sprintf("vol-%d", i), "node-a", csitest.MNMW))
			codesSeen[i] = status.Code(err)
			if err != nil && !strings.Contains(err.Error(), "Request limit exceeded") {
				t.Errorf("throttled publish error %v does not say so", err)
			}
		})
	}
	wg.Wait()
	ok, throttled := 0, 0
	for i, c := range codesSeen {
		published := len(e.d.Published(fmt.Sprintf("vol-%d", i))) == 1
		switch {
		case c == codes.OK && published:
			ok++
		case c == codes.ResourceExhausted && !published:
			throttled++
		default:
			t.Errorf("vol-%d: code %s, published %v", i, c, published)
		}
	}
	if ok != 3 || throttled != 2 {
		t.Errorf("%d published, %d throttled; want 3 and 2 (burst 3)", ok, throttled)
	}
	if time.Since(start) < 50*time.Millisecond {
		t.Error("the admitted publishes did not wait their latency")
	}
	for range 5 {
		if _, err := e.ctrl.ControllerGetCapabilities(testCtx(t), &csi.ControllerGetCapabilitiesRequest{}); err != nil {
			t.Fatalf("ControllerGetCapabilities went through the request limit: %v", err)
		}
	}
	s := e.d.Stats().Backend
	if s == nil || s.Throttled != 2 || s.Served != 3 || s.InFlight != 0 {
		t.Errorf("backend stats = %+v, want 2 throttled, 3 served, none in flight", s)
	}
	if pub := e.d.Stats().Methods["ControllerPublishVolume"]; pub.Calls != 5 {
		t.Errorf("publish calls logged = %d, want all 5 (the throttled ones too)", pub.Calls)
	}
}

// A caller that gives up during the latency gets its context's error and
// nothing is published.
func TestBackendCallerGivingUpDuringTheLatencyPublishesNothing(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Backend = &Backend{Latency: Duration(time.Minute)}
	e := newEnv(t, cfg)
	e.seed(t, "vol-1")
	ctx, cancel := context.WithTimeout(testCtx(t), 100*time.Millisecond)
	defer cancel()
	_, err := e.ctrl.ControllerPublishVolume(ctx, pubReq("vol-1", "node-a", csitest.MNMW))
	wantCode(t, err, codes.DeadlineExceeded)
	eventually(t, "the call to end in the driver", func() bool { s, _ := e.d.BackendStats(); return s.InFlight == 0 })
	if got := e.d.Published("vol-1"); len(got) != 0 {
		t.Errorf("vol-1 published to %v after the caller gave up", got)
	}
}

func TestParseBackend(t *testing.T) {
	slow, _ := ProfileBackend("slow-cloud")
	for _, tc := range []struct {
		name, in string
		want     *Backend
		err      string
	}{
		{"profile alone", `profile: slow-cloud`, &slow, ""},
		{"every field", `{"latency": "250ms", "spread": 0.1, "capacity": 8, "rate": 4, "burst": 2, "throttleCode": "UNAVAILABLE",
			"phases": [{"after": "10s", "capacity": 2, "rate": 1}], "seed": 9}`,
			&Backend{Latency: Duration(250 * time.Millisecond), Spread: 0.1, Capacity: 8, Rate: 4, Burst: 2, ThrottleCode: Code(codes.Unavailable),
				Phases: []BackendPhase{{After: Duration(10 * time.Second), Capacity: 2, Rate: 1}}, Seed: 9}, ""},
		{"unknown profile", `profile: tape-library`, nil, `unknown backend profile "tape-library" (known: fast-san, slow-cloud, throttling-api)`},
		{"unknown field", `{"latency": "1s", "capcity": 3}`, nil, `unknown field "capcity"`},
		{"bad throttle code", `{"latency": "1s", "throttleCode": "NotFound"}`, nil, "throttle code must be ResourceExhausted or Unavailable"},
		{"latency without unit", `{"latency": 5}`, nil, "duration must be a string"},
		{"phases out of order", `{"latency": "1s", "phases": [{"after": "20s"}, {"after": "10s"}]}`, nil, "phase 1 starts before phase 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseBackend([]byte(tc.in))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error = %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", *tc.want) {
				t.Errorf("got %+v\nwant %+v", got, *tc.want)
			}
		})
	}
}

// The HTTP endpoint sets, shows and removes the backend model.
func TestBackendHTTPEndpoint(t *testing.T) {
	d, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(d.HTTPHandler())
	defer srv.Close()
	do := func(method, path, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var buf bytes.Buffer
		_, _ = buf.ReadFrom(resp.Body)
		return resp.StatusCode, buf.String()
	}
	if code, _ := do("GET", "/backend", ""); code != http.StatusNotFound {
		t.Errorf("GET /backend with none set = %d, want 404", code)
	}
	if code, body := do("PUT", "/backend", `{"profile": "fast-san"}`); code != http.StatusNoContent {
		t.Fatalf("PUT /backend = %d %s", code, body)
	}
	code, body := do("GET", "/backend", "")
	var s BackendStats
	if err := json.Unmarshal([]byte(body), &s); code != http.StatusOK || err != nil || s.Profile != "fast-san" || s.Capacity != 64 || math.Abs(s.OpsPerSecond-3136.6) > 0.1 {
		t.Errorf("GET /backend = %d %s, want fast-san with capacity 64, 3136.6 ops/s (64 per mean latency of 20 ms × e^(0.2²/2))", code, body)
	}
	if code, body := do("PUT", "/backend", `{"latency": "-1s"}`); code != http.StatusBadRequest || !strings.Contains(body, "must not be negative") {
		t.Errorf("PUT of a bad backend = %d %s, want 400 naming the field", code, body)
	}
	if code, _ := do("DELETE", "/backend", ""); code != http.StatusNoContent {
		t.Errorf("DELETE /backend = %d", code)
	}
	if _, ok := d.BackendStats(); ok {
		t.Error("backend still set after DELETE")
	}
}
