package csimock

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2/ktesting"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/latchcsi/latch/internal/csi/csitest"
	"github.com/latchcsi/latch/internal/testsupport"
)

// eventually polls cond until it holds; it is for waiting on another
// goroutine to reach a point (a call in flight, a timer armed), never for
// asserting durations.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testsupport.Eventually(t, t.Context(), 10*time.Second, what, func(context.Context) (bool, error) { return cond(), nil })
}

func inFlight(d *Driver, method string) bool {
	for _, c := range d.CallsTo(method) {
		if !c.Done() {
			return true
		}
	}
	return false
}

// publishCodes publishes vol-1 to node-a n times and returns the codes.
func publishCodes(t *testing.T, e *env, n int) []codes.Code {
	t.Helper()
	var out []codes.Code
	for range n {
		_, err := e.ctrl.ControllerPublishVolume(testCtx(t), pubReq("vol-1", "node-a", csitest.SNW))
		out = append(out, status.Code(err))
	}
	return out
}

const (
	ok   = codes.OK
	unav = codes.Unavailable
)

func TestFaultSelectors(t *testing.T) {
	tests := []struct {
		name  string
		rules []Rule
		want  []codes.Code
	}{
		{
			name:  "fault: nth=2 fails only the second publish",
			rules: []Rule{{Method: "ControllerPublishVolume", Nth: 2, Code: unav}},
			want:  []codes.Code{ok, unav, ok, ok},
		},
		{
			name:  "fault: no selector fails every publish",
			rules: []Rule{{Method: "/csi.v1.Controller/ControllerPublishVolume", Code: unav}},
			want:  []codes.Code{unav, unav, unav},
		},
		{
			name:  "fault: once fails only the first publish",
			rules: []Rule{{Method: "ControllerPublishVolume", Once: true, Code: unav}},
			want:  []codes.Code{unav, ok, ok},
		},
		{
			name:  "fault: times=2 with every=2 fails the 2nd and 4th publish",
			rules: []Rule{{Method: "ControllerPublishVolume", Every: 2, Times: 2, Code: unav}},
			want:  []codes.Code{ok, unav, ok, unav, ok, ok},
		},
		{
			name:  "fault: rule for another volume does not fire",
			rules: []Rule{{Method: "ControllerPublishVolume", VolumeID: "vol-2", Code: unav}},
			want:  []codes.Code{ok, ok},
		},
		{
			name:  "fault: rule for this volume and node fires",
			rules: []Rule{{Method: "*", VolumeID: "vol-1", NodeID: "node-a", Code: unav}},
			want:  []codes.Code{unav},
		},
		{
			name: "fault: first error rule wins and the later one keeps its budget",
			rules: []Rule{
				{Method: "ControllerPublishVolume", Once: true, Code: codes.Internal},
				{Method: "ControllerPublishVolume", Once: true, Code: unav},
			},
			want: []codes.Code{codes.Internal, unav, ok},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Faults = tc.rules
			e := newEnv(t, cfg)
			e.seed(t, "vol-1")
			if got := publishCodes(t, e, len(tc.want)); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("codes = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestFaultProbabilityIsSeeded(t *testing.T) {
	run := func() []codes.Code {
		cfg := DefaultConfig()
		cfg.Faults = []Rule{{Method: "ControllerPublishVolume", Probability: 0.5, Seed: 42, Code: unav}}
		e := newEnv(t, cfg)
		e.seed(t, "vol-1")
		return publishCodes(t, e, 60)
	}
	first, second := run(), run()
	if !reflect.DeepEqual(first, second) {
		t.Fatalf("same seed gave different sequences:\n%v\n%v", first, second)
	}
	failed := 0
	for _, c := range first {
		if c == unav {
			failed++
		}
	}
	if failed < 15 || failed > 45 {
		t.Fatalf("%d of 60 calls failed with probability 0.5", failed)
	}
}

func TestFaultAddRemoveAtRuntime(t *testing.T) {
	e := newEnv(t, DefaultConfig())
	e.seed(t, "vol-1")
	id, err := e.d.AddFault(Rule{Method: "ControllerPublishVolume", Code: codes.Internal, Message: "backend on fire"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.ctrl.ControllerPublishVolume(testCtx(t), pubReq("vol-1", "node-a", csitest.SNW))
	if status.Code(err) != codes.Internal || status.Convert(err).Message() != "backend on fire" {
		t.Fatalf("publish with rule = %v", err)
	}
	if f := e.d.Faults(); len(f) != 1 || f[0].Fired != 1 || f[0].Matched != 1 {
		t.Fatalf("Faults() = %+v, want one rule fired once", f)
	}
	if !e.d.RemoveFault(id) || e.d.RemoveFault(id) {
		t.Fatal("RemoveFault should succeed once")
	}
	e.mustPublish(t, "vol-1", "node-a", csitest.SNW)
	calls := e.d.CallsTo("ControllerPublishVolume")
	if len(calls) != 2 || !reflect.DeepEqual(calls[0].Faults, []string{id}) || calls[0].Code != codes.Internal || calls[1].Code != codes.OK {
		t.Fatalf("call log = %+v", calls)
	}
	if _, err := e.d.AddFault(Rule{Method: "ControllerPublishVolum", Code: codes.Internal}); err == nil {
		t.Fatal("a misspelled method must be rejected")
	}
}

func TestFaultHangUntilDeadline(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Faults = []Rule{{Method: "ControllerPublishVolume", Hang: true}}
	e := newEnv(t, cfg)
	e.seed(t, "vol-1")
	ctx, cancel := context.WithTimeout(testCtx(t), 100*time.Millisecond)
	defer cancel()
	_, err := e.ctrl.ControllerPublishVolume(ctx, pubReq("vol-1", "node-a", csitest.SNW))
	wantCode(t, err, codes.DeadlineExceeded)
	// The driver side sees the caller give up too and records it.
	eventually(t, "the hung call to finish", func() bool { return !inFlight(e.d, "ControllerPublishVolume") })
	if c := e.d.CallsTo("ControllerPublishVolume")[0]; c.Code != codes.DeadlineExceeded && c.Code != codes.Canceled {
		t.Fatalf("logged code %s, want DeadlineExceeded or Canceled", c.Code)
	}
	wantNodes(t, e, "vol-1") // hung before the state change
}

func TestFaultLatencyUsesTheClock(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	cfg := DefaultConfig()
	cfg.Clock = clk
	cfg.Faults = []Rule{{Method: "ControllerPublishVolume", Latency: time.Minute}}
	e := newEnv(t, cfg)
	e.seed(t, "vol-1")
	errc := make(chan error, 1)
	go func() {
		_, err := e.ctrl.ControllerPublishVolume(testCtx(t), pubReq("vol-1", "node-a", csitest.SNW))
		errc <- err
	}()
	eventually(t, "the latency timer", clk.HasWaiters)
	wantNodes(t, e, "vol-1") // the delay is before the state change
	clk.Step(time.Minute)
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	wantNodes(t, e, "vol-1", "node-a")
	if c := e.d.CallsTo("ControllerPublishVolume")[0]; c.End.Sub(c.Start) != time.Minute {
		t.Fatalf("logged duration %s, want 1m on the fake clock", c.End.Sub(c.Start))
	}
}

func TestFaultAfterStateChange(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Faults = []Rule{{Method: "ControllerPublishVolume", Phase: PhaseAfter, Once: true, Code: codes.DeadlineExceeded}}
	e := newEnv(t, cfg)
	e.seed(t, "vol-1")
	_, err := e.ctrl.ControllerPublishVolume(testCtx(t), pubReq("vol-1", "node-a", csitest.SNW))
	wantCode(t, err, codes.DeadlineExceeded)
	// The backend did publish; only the reply was lost.
	wantNodes(t, e, "vol-1", "node-a")
	// The retry a careful attacher makes is an idempotent repeat.
	e.mustPublish(t, "vol-1", "node-a", csitest.SNW)
	if st := e.d.Stats().Publish; st.DuplicatePublishes != 1 {
		t.Fatalf("duplicate publishes = %d, want 1", st.DuplicatePublishes)
	}
}

func TestFaultAfterPhaseSkipsFailedCalls(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Faults = []Rule{{Method: "ControllerPublishVolume", Phase: PhaseAfter, Once: true, Code: codes.DeadlineExceeded}}
	e := newEnv(t, cfg)
	// NotFound from the handler: the after rule neither acts nor spends its budget.
	_, err := e.ctrl.ControllerPublishVolume(testCtx(t), pubReq("vol-1", "node-a", csitest.SNW))
	wantCode(t, err, codes.NotFound)
	e.seed(t, "vol-1")
	_, err = e.ctrl.ControllerPublishVolume(testCtx(t), pubReq("vol-1", "node-a", csitest.SNW))
	wantCode(t, err, codes.DeadlineExceeded)
}

// waitReady makes a call wait for the channel to reconnect after a restart.
var waitReady = grpc.WaitForReady(true)

func TestCrashAndRestart(t *testing.T) {
	tests := []struct {
		name      string
		keepState bool
		phase     Phase
		wantNodes []string
	}{
		{"crash: publish applied but reply pending, keep state → publication survives", true, PhaseAfter, []string{"node-a"}},
		{"crash: publish applied but reply pending, forget in-flight → publication rolled back", false, PhaseAfter, nil},
		{"crash: publish hung before the state change, keep state → nothing published", true, PhaseBefore, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Faults = []Rule{{Method: "ControllerPublishVolume", VolumeID: "vol-1", Phase: tc.phase, Hang: true}}
			e := newEnv(t, cfg)
			e.seed(t, "vol-1", "vol-2")
			e.mustPublish(t, "vol-2", "node-a", csitest.SNW) // completed before the crash: always kept

			errc := make(chan error, 1)
			go func() {
				_, err := e.ctrl.ControllerPublishVolume(testCtx(t), pubReq("vol-1", "node-a", csitest.SNW))
				errc <- err
			}()
			eventually(t, "the publish to hang", func() bool { return inFlight(e.d, "ControllerPublishVolume") })
			if err := e.d.Crash(tc.keepState); err != nil {
				t.Fatal(err)
			}
			if err := <-errc; status.Code(err) != codes.Unavailable {
				t.Fatalf("in-flight publish got %v, want Unavailable", err)
			}
			if e.d.Serving() {
				t.Fatal("still serving after Crash")
			}
			wantNodes(t, e, "vol-1", tc.wantNodes...)
			wantNodes(t, e, "vol-2", "node-a")

			if err := e.d.Restart(); err != nil {
				t.Fatal(err)
			}
			e.d.ClearFaults()
			// The same client reconnects to the same socket path. A call
			// made before the client has seen its old connection close is
			// sent on it and fails Unavailable (gRPC does not retry a call
			// it already sent), as it would for a sidecar, which retries.
			var err error
			eventually(t, "a publish after the restart to get through", func() bool {
				_, err = e.ctrl.ControllerPublishVolume(testCtx(t), pubReq("vol-1", "node-a", csitest.SNW), waitReady)
				return status.Code(err) != codes.Unavailable
			})
			if err != nil {
				t.Fatalf("publish after restart: %v", err)
			}
			wantNodes(t, e, "vol-1", "node-a")
		})
	}
}

func TestCrashFencesHandlersOfTheOldInstance(t *testing.T) {
	e := newEnv(t, DefaultConfig())
	e.seed(t, "vol-1")
	epoch := e.d.state.currentEpoch()
	if err := e.d.Crash(true); err != nil {
		t.Fatal(err)
	}
	// A handler of the crashed instance that reaches the store late.
	_, err := e.d.state.publish(callRef{id: 99, epoch: epoch, fenced: true}, publishArgs{VolumeID: "vol-1", NodeID: "node-a", Capability: csitest.Mount(csitest.SNW, "")}, &e.d.cfg)
	wantCode(t, err, codes.Unavailable)
	wantNodes(t, e, "vol-1")
}

func TestParseRules(t *testing.T) {
	yamlDoc := `
rules:
- id: slow-attach
  method: ControllerPublishVolume
  latency: 250ms
- method: ControllerPublishVolume
  nodeID: node-b
  phase: after
  code: DEADLINE_EXCEEDED
  nth: 3
- method: ControllerUnpublishVolume
  probability: 0.1
  seed: 7
  code: 14
  message: detach flaked
`
	rules, err := ParseRules([]byte(yamlDoc))
	if err != nil {
		t.Fatal(err)
	}
	want := []Rule{
		{ID: "slow-attach", Method: "ControllerPublishVolume", Latency: 250 * time.Millisecond},
		{Method: "ControllerPublishVolume", NodeID: "node-b", Phase: PhaseAfter, Code: codes.DeadlineExceeded, Nth: 3},
		{Method: "ControllerUnpublishVolume", Probability: 0.1, Seed: 7, Code: codes.Unavailable, Message: "detach flaked"},
	}
	if !reflect.DeepEqual(rules, want) {
		t.Fatalf("ParseRules =\n%+v\nwant\n%+v", rules, want)
	}
	// JSON list form, round-tripped through MarshalJSON.
	js, err := (Rule{Method: "Probe", Code: codes.FailedPrecondition, Latency: time.Second}).MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	rules, err = ParseRules(append(append([]byte("["), js...), ']'))
	if err != nil || len(rules) != 1 || rules[0].Code != codes.FailedPrecondition || rules[0].Latency != time.Second {
		t.Fatalf("round trip = %+v, %v (json %s)", rules, err, js)
	}
	for name, doc := range map[string]string{
		"unknown field":  `[{"method": "Probe", "code": "Internal", "colour": "red"}]`,
		"unknown method": `[{"method": "Prob", "code": "Internal"}]`,
		"unknown code":   `[{"method": "Probe", "code": "Sad"}]`,
		"no action":      `[{"method": "Probe"}]`,
		"bad phase":      `[{"method": "Probe", "hang": true, "phase": "during"}]`,
		"bad latency":    `[{"method": "Probe", "latency": "soon"}]`,
	} {
		if _, err := ParseRules([]byte(doc)); err == nil {
			t.Errorf("%s: ParseRules accepted %s", name, doc)
		}
	}
}

func TestCallLogHasNoSecrets(t *testing.T) {
	e := newEnv(t, DefaultConfig())
	e.seed(t, "vol-1")
	req := pubReq("vol-1", "node-a", csitest.SNW)
	req.Secrets = map[string]string{"password": "hunter2"}
	if _, err := e.ctrl.ControllerPublishVolume(testCtx(t), req); err != nil {
		t.Fatal(err)
	}
	c := e.d.CallsTo("ControllerPublishVolume")[0]
	want := Call{ID: c.ID, Method: "ControllerPublishVolume", VolumeID: "vol-1", NodeID: "node-a", Start: c.Start, End: c.End, Code: codes.OK, CodeName: "OK"}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("call = %+v, want %+v", c, want)
	}
	logs := e.logger.GetSink().(ktesting.Underlier).GetBuffer().String()
	if strings.Contains(logs, "hunter2") || !strings.Contains(logs, "stripped") {
		t.Fatalf("request logging leaks or does not strip secrets:\n%s", logs)
	}
}
