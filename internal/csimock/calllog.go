package csimock

import (
	"sync"
	"time"

	"google.golang.org/grpc/codes"
)

// Call is one RPC as the driver saw it. Secrets, contexts and parameters
// are deliberately not recorded.
type Call struct {
	ID       uint64 `json:"id"`
	Method   string `json:"method"`
	VolumeID string `json:"volumeID,omitempty"`
	// Name is the volume name of CreateVolume.
	Name string `json:"name,omitempty"`
	// NodeID is the request's node ID; for Node RPCs, which carry none,
	// the node whose Node service got the call.
	NodeID string `json:"nodeID,omitempty"`
	// Endpoint is the node ID of the node endpoint (StartNode) whose
	// socket got the call; empty for the driver's own socket.
	Endpoint string    `json:"endpoint,omitempty"`
	Readonly bool      `json:"readonly,omitempty"`
	Start    time.Time `json:"start"`
	// End is zero while the call is in flight.
	End time.Time `json:"end,omitzero"`
	// Code is the gRPC code returned; meaningful once End is set.
	Code     codes.Code `json:"-"`
	CodeName string     `json:"code,omitempty"`
	Message  string     `json:"message,omitempty"`
	// Faults lists the IDs of the fault rules that acted on this call.
	Faults []string `json:"faults,omitempty"`
}

// Done reports whether the call has returned.
func (c Call) Done() bool { return !c.End.IsZero() }

// MethodStats counts calls of one method by result.
type MethodStats struct {
	Calls    int64 `json:"calls"`
	InFlight int64 `json:"inFlight"`
	// MaxInFlight is the most calls of the method ever in flight at once.
	MaxInFlight int64            `json:"maxInFlight"`
	ByCode      map[string]int64 `json:"byCode"`
}

// callLog is a bounded ring of calls in start order plus per-method
// counters that are never dropped.
type callLog struct {
	mu      sync.Mutex
	nextID  uint64
	ring    []*Call
	head    int // index of the oldest entry once the ring is full
	dropped int64
	methods map[string]*MethodStats
}

func newCallLog(size int) *callLog {
	if size <= 0 {
		size = DefaultCallLogSize
	}
	return &callLog{ring: make([]*Call, 0, size), methods: map[string]*MethodStats{}}
}

func (l *callLog) begin(c *Call) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.nextID++
	c.ID = l.nextID
	if len(l.ring) < cap(l.ring) {
		l.ring = append(l.ring, c)
	} else {
		l.ring[l.head] = c
		l.head = (l.head + 1) % len(l.ring)
		l.dropped++
	}
	m := l.methods[c.Method]
	if m == nil {
		m = &MethodStats{ByCode: map[string]int64{}}
		l.methods[c.Method] = m
	}
	m.Calls++
	m.InFlight++
	m.MaxInFlight = max(m.MaxInFlight, m.InFlight)
}

func (l *callLog) end(c *Call, end time.Time, code codes.Code, msg string, faults []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c.End = end
	c.Code = code
	c.CodeName = code.String()
	c.Message = msg
	c.Faults = faults
	m := l.methods[c.Method]
	if m == nil { // reset while the call was in flight
		return
	}
	m.InFlight--
	m.ByCode[c.CodeName]++
}

func (l *callLog) calls() []Call {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Call, 0, len(l.ring))
	for i := range l.ring {
		out = append(out, *l.ring[(l.head+i)%len(l.ring)])
	}
	return out
}

func (l *callLog) methodStats() (map[string]MethodStats, int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]MethodStats, len(l.methods))
	for k, m := range l.methods {
		c := *m
		c.ByCode = make(map[string]int64, len(m.ByCode))
		for code, n := range m.ByCode {
			c.ByCode[code] = n
		}
		out[k] = c
	}
	return out, l.dropped
}

func (l *callLog) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ring = l.ring[:0]
	l.head = 0
	l.dropped = 0
	l.methods = map[string]*MethodStats{}
}
