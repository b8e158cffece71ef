package csimock

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
)

// Phase says when a fault acts relative to the driver's state change.
type Phase string

const (
	// PhaseBefore acts before the handler runs: the call has no effect.
	PhaseBefore Phase = "before"
	// PhaseAfter acts after the handler succeeded and changed state: the
	// backend did the work but the caller sees the fault ("reply lost").
	// Only calls whose handler succeeded count as matches for these rules.
	PhaseAfter Phase = "after"
)

// Rule is one composable fault, in the spirit of pebble's errorfs: a
// matcher (method, volume, node), a selector (Nth call, every K-th call,
// probability, limited count) and an action (latency, then an error code or
// a hang). Several rules may match one call: their latencies add up, and
// the first rule (in insertion order) with an error or hang decides the
// outcome.
type Rule struct {
	// ID names the rule; AddFault assigns one when empty.
	ID string `json:"id,omitempty"`

	// Method is the RPC name ("ControllerPublishVolume") or full gRPC
	// method ("/csi.v1.Controller/ControllerPublishVolume"); empty or "*"
	// matches every method.
	Method string `json:"method,omitempty"`
	// VolumeID and NodeID, when set, must equal the request's.
	VolumeID string `json:"volumeID,omitempty"`
	NodeID   string `json:"nodeID,omitempty"`
	// Phase defaults to PhaseBefore.
	Phase Phase `json:"phase,omitempty"`

	// Nth fires only on the Nth matching call (1-based). 0: any call.
	Nth int64 `json:"nth,omitempty"`
	// Every fires on every Every-th matching call. 0: any call.
	Every int64 `json:"every,omitempty"`
	// Probability in (0,1] fires on that fraction of matching calls, drawn
	// from a random source seeded with Seed (or the driver's seed). 0 means
	// always.
	Probability float64 `json:"probability,omitempty"`
	Seed        uint64  `json:"seed,omitempty"`
	// Times limits how often the rule fires; 0 is unlimited. Once is
	// Times=1.
	Times int64 `json:"times,omitempty"`
	Once  bool  `json:"once,omitempty"`

	// Latency delays the call (or its reply, in PhaseAfter). The delay
	// ends early when the caller gives up.
	Latency time.Duration `json:"-"`
	// Code, if not OK, fails the call with this gRPC code and Message.
	Code    codes.Code `json:"-"`
	Message string     `json:"message,omitempty"`
	// Hang blocks the call until the caller's context is done (or the
	// driver crashes or stops), then returns the context's error; or until
	// ReleaseHang(ID), then the call goes on: it fails with Code when set,
	// else it runs (a call that succeeds late).
	Hang bool `json:"hang,omitempty"`
	// NextToken (ListVolumes only, phase before) replaces the next_token
	// of the page the call answers, so that paging never ends: the call
	// lists the first page, whatever token it was given, and hands back a
	// token of the driver's own that it accepts again (NextTokenFresh: a
	// new one every call; NextTokenRepeat: always the same one).
	NextToken NextTokenFault `json:"nextToken,omitempty"`
}

// NextTokenFault is how a rule's ListVolumes pages never end.
type NextTokenFault string

const (
	// NextTokenFresh answers every page with a token never given before.
	NextTokenFresh NextTokenFault = "fresh"
	// NextTokenRepeat answers every page with the same token.
	NextTokenRepeat NextTokenFault = "repeat"
)

// RuleStatus is a rule with its counters.
type RuleStatus struct {
	Rule
	// Matched counts calls that matched the method/volume/node filter.
	Matched int64 `json:"matched"`
	// Fired counts calls the rule acted on.
	Fired int64 `json:"fired"`
}

// knownMethods are the RPC names of every CSI service, so that a typo in a
// fault file is an error instead of a rule that never fires.
var knownMethods = func() map[string]bool {
	m := map[string]bool{}
	for _, sd := range []*grpc.ServiceDesc{
		&csi.Identity_ServiceDesc, &csi.Controller_ServiceDesc, &csi.Node_ServiceDesc, &csi.GroupController_ServiceDesc,
	} {
		for _, md := range sd.Methods {
			m[md.MethodName] = true
		}
	}
	return m
}()

// normalizeMethod turns "/csi.v1.Controller/ControllerPublishVolume" into
// "ControllerPublishVolume" and "*" into "".
func normalizeMethod(m string) string {
	if i := strings.LastIndex(m, "/"); i >= 0 {
		m = m[i+1:]
	}
	if m == "*" {
		return ""
	}
	return m
}

func (r *Rule) validate() error {
	if m := normalizeMethod(r.Method); m != "" && !knownMethods[m] {
		return fmt.Errorf("unknown CSI method %q", r.Method)
	}
	switch r.Phase {
	case "", PhaseBefore, PhaseAfter:
	default:
		return fmt.Errorf("phase must be %q or %q, got %q", PhaseBefore, PhaseAfter, r.Phase)
	}
	if r.Nth < 0 || r.Every < 0 || r.Times < 0 {
		return fmt.Errorf("nth, every and times must not be negative")
	}
	if r.Probability < 0 || r.Probability > 1 {
		return fmt.Errorf("probability must be within [0,1], got %v", r.Probability)
	}
	if r.Latency < 0 {
		return fmt.Errorf("latency must not be negative, got %s", r.Latency)
	}
	if r.Code > codes.Unauthenticated {
		return fmt.Errorf("unknown gRPC code %d", r.Code)
	}
	switch r.NextToken {
	case "":
	case NextTokenFresh, NextTokenRepeat:
		if normalizeMethod(r.Method) != "ListVolumes" || r.Phase == PhaseAfter {
			return fmt.Errorf("nextToken needs method ListVolumes and phase %q", PhaseBefore)
		}
	default:
		return fmt.Errorf("nextToken must be %q or %q, got %q", NextTokenFresh, NextTokenRepeat, r.NextToken)
	}
	if r.Latency == 0 && r.Code == codes.OK && !r.Hang && r.NextToken == "" {
		return fmt.Errorf("rule has no action: set latency, code, hang or nextToken")
	}
	return nil
}

type ruleState struct {
	Rule
	matched, fired int64
	rng            *rand.Rand
	// release is closed by ReleaseHang: the calls the rule holds go on.
	release chan struct{}
}

// faultSet holds the rules in insertion order.
type faultSet struct {
	mu     sync.Mutex
	rules  []*ruleState
	nextID int
	seed   uint64
}

// faultAction is what the matching rules of one phase ask for.
type faultAction struct {
	latency time.Duration
	code    codes.Code
	message string
	hang    bool
	// release ends the hang (the deciding rule's ReleaseHang).
	release <-chan struct{}
	// nextToken: the first firing rule's ListVolumes token fault.
	nextToken NextTokenFault
	ruleIDs   []string
}

func (a faultAction) none() bool {
	return a.latency == 0 && a.code == codes.OK && !a.hang
}

func (f *faultSet) add(r Rule) (string, error) {
	if err := r.validate(); err != nil {
		return "", err
	}
	r.Method = normalizeMethod(r.Method)
	if r.Phase == "" {
		r.Phase = PhaseBefore
	}
	if r.Once && r.Times == 0 {
		r.Times = 1
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextID++
	if r.ID == "" {
		r.ID = fmt.Sprintf("fault-%d", f.nextID)
	}
	for _, existing := range f.rules {
		if existing.ID == r.ID {
			return "", fmt.Errorf("fault rule %q already exists", r.ID)
		}
	}
	seed := r.Seed
	if seed == 0 {
		// Different rules get different streams even with one driver seed.
		seed = f.seed + uint64(f.nextID)
	}
	f.rules = append(f.rules, &ruleState{Rule: r, rng: rand.New(rand.NewPCG(seed, 0x6c61746368)), release: make(chan struct{})})
	return r.ID, nil
}

func (f *faultSet) remove(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, r := range f.rules {
		if r.ID == id {
			f.rules = append(f.rules[:i], f.rules[i+1:]...)
			return true
		}
	}
	return false
}

// releaseHang removes rule id and lets every call it holds go on.
func (f *faultSet) releaseHang(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, r := range f.rules {
		if r.ID == id {
			close(r.release)
			f.rules = append(f.rules[:i], f.rules[i+1:]...)
			return true
		}
	}
	return false
}

func (f *faultSet) clear() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rules = nil
}

func (f *faultSet) list() []RuleStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]RuleStatus, 0, len(f.rules))
	for _, r := range f.rules {
		out = append(out, RuleStatus{Rule: r.Rule, Matched: r.matched, Fired: r.fired})
	}
	return out
}

// evaluate advances the counters of every rule of phase that matches the
// call and returns the combined action.
func (f *faultSet) evaluate(phase Phase, method, volumeID, nodeID string) faultAction {
	var act faultAction
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range f.rules {
		if r.Phase != phase ||
			r.Method != "" && r.Method != method ||
			r.VolumeID != "" && r.VolumeID != volumeID ||
			r.NodeID != "" && r.NodeID != nodeID {
			continue
		}
		r.matched++
		decisive := r.Code != codes.OK || r.Hang
		if decisive && (act.code != codes.OK || act.hang) {
			// An earlier rule already decided the outcome; leave this
			// rule's budget (Times) for a later call.
			continue
		}
		if !r.selects() {
			continue
		}
		r.fired++
		act.ruleIDs = append(act.ruleIDs, r.ID)
		act.latency += r.Latency
		if act.nextToken == "" {
			act.nextToken = r.NextToken
		}
		if decisive {
			act.code, act.message, act.hang, act.release = r.Code, r.Message, r.Hang, r.release
			if act.message == "" {
				act.message = fmt.Sprintf("injected fault %s", r.ID)
			}
		}
	}
	return act
}

// selects applies the Nth / Every / Times / Probability selectors to the
// current (already counted) match.
func (r *ruleState) selects() bool {
	if r.Times > 0 && r.fired >= r.Times {
		return false
	}
	if r.Nth > 0 && r.matched != r.Nth {
		return false
	}
	if r.Every > 0 && r.matched%r.Every != 0 {
		return false
	}
	if r.Probability > 0 && r.Probability < 1 && r.rng.Float64() >= r.Probability {
		return false
	}
	return true
}
