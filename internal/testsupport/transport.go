package testsupport

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"
)

// RoundTripFunc is an http.RoundTripper made of a function.
type RoundTripFunc func(*http.Request) (*http.Response, error)

// RoundTrip calls f.
func (f RoundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// Write is one API write (any request but GET) that went through an
// APITransport.
type Write struct {
	// Method is the HTTP method: POST, PUT, PATCH or DELETE.
	Method string
	// Resource and Subresource as in RBAC: "volumeattachments", "status".
	Resource, Subresource string
	// Namespace and Name of the object; Name is empty for a create.
	Namespace, Name string
	// Path is the request's URL path.
	Path string
	// Code is the answer's HTTP status, 0 when the request failed
	// without one (Err is then set).
	Code int
	Err  error
	// Injected is true when a fault rule answered instead of the server.
	Injected bool
	// At is when the answer came.
	At time.Time
	// For a failed write (Code 400 or more): Reason and Message of the
	// answer's metav1.Status (JSON or protobuf; empty when the body is
	// none), and Body, the answer's first 64 KiB as sent.
	Reason  metav1.StatusReason
	Message string
	Body    []byte
}

// Key is "METHOD resource[/subresource]", e.g. "PATCH
// volumeattachments/status": the key of Counts.
func (w Write) Key() string { return w.Method + " " + w.ResourceKey() }

// ResourceKey is "resource[/subresource]".
func (w Write) ResourceKey() string {
	if w.Subresource != "" {
		return w.Resource + "/" + w.Subresource
	}
	return w.Resource
}

// Succeeded reports whether the server accepted the write (2xx).
func (w Write) Succeeded() bool { return w.Err == nil && w.Code >= 200 && w.Code < 300 }

// APITransport sits in a client's transport (rest.Config.Wrap(t.Wrap)).
// It records every write the client makes and applies fault rules: fail
// the Nth matching write with a status, delay matching requests, or cut
// the client off the API server (Partition). The zero value is not
// usable: use NewAPITransport.
type APITransport struct {
	mu     sync.Mutex
	writes []Write
	rules  []*rule
	// sent counts writes by Key from the moment they are sent (or
	// answered by a rule), before any answer: see Counts.
	sent map[string]int
	// denied are the requests the server refused: see Denied.
	denied []string

	partitioned      atomic.Bool
	partitionTimeout time.Duration
}

// NewAPITransport returns a transport that records and injects nothing
// until told to.
func NewAPITransport() *APITransport {
	return &APITransport{partitionTimeout: 5 * time.Second}
}

// Match selects requests for a fault rule. Empty fields match anything.
type Match struct {
	// Method is an HTTP method (POST, PUT, PATCH, DELETE, GET) or an API
	// verb (create, update, patch, delete, get); empty matches every
	// write (not GET).
	Method string
	// Resource is, as in RBAC, "resource" (the object itself, not its
	// subresources), "resource/subresource", or "resource/*" (the object
	// and every subresource).
	Resource string
	// Name is the object's name: for a create, whose path names none,
	// the name in the object sent.
	Name string
}

func (m Match) matches(method string, p parsedPath) bool {
	switch want := methodOf(m.Method); {
	case want == "" && method == http.MethodGet:
		return false
	case want != "" && want != method:
		return false
	}
	if m.Resource != "" {
		res, sub, _ := strings.Cut(m.Resource, "/")
		if res != p.resource || (sub != "*" && sub != p.subresource) {
			return false
		}
	}
	return m.Name == "" || m.Name == p.name || (p.name == "" && m.Name == p.created)
}

// methodOf turns an API verb into its HTTP method.
func methodOf(verbOrMethod string) string {
	switch strings.ToLower(verbOrMethod) {
	case "create", "post":
		return http.MethodPost
	case "update", "put":
		return http.MethodPut
	case "patch":
		return http.MethodPatch
	case "delete":
		return http.MethodDelete
	case "get", "list", "watch":
		return http.MethodGet
	}
	return strings.ToUpper(verbOrMethod)
}

type rule struct {
	match Match
	// nth: the rule fires on the nth match counted from its creation
	// (1-based); 0 fires on every match. times bounds how often it fires
	// (0: no bound).
	nth, times  int
	seen, fired int
	code        int
	message     string
	delay       time.Duration
	// after: the delay or failure comes after the server answered (the
	// write happened, the client does not know).
	after bool
	// reason overrides the reason the API server gives code.
	reason metav1.StatusReason
	// lag: a LagWatches rule; pick passes it over.
	lag bool
}

// Rule is a handle to remove a fault rule.
type Rule struct{ r *rule }

// FailNth answers the nth write (1-based, counted from now) matching m
// with an API error of the given HTTP status, without sending it to the
// server.
func (t *APITransport) FailNth(m Match, n, code int, message string) Rule {
	return t.add(&rule{match: m, nth: n, times: 1, code: code, message: message})
}

// Fail answers every write matching m with an API error of the given
// status, times times (0: until removed).
func (t *APITransport) Fail(m Match, times, code int, message string) Rule {
	return t.add(&rule{match: m, times: times, code: code, message: message})
}

// FailAfterWrite lets the nth write matching m reach the server, then
// answers the client with an error of the given status (0: a connection
// error): the write happened, its outcome is unknown to the client.
func (t *APITransport) FailAfterWrite(m Match, n, code int, message string) Rule {
	return t.add(&rule{match: m, nth: n, times: 1, code: code, message: message, after: true})
}

// FailAfterWriteWith is FailAfterWrite with the answer's reason chosen,
// where FailAfterWrite gives the one the API server gives code: e.g. 409
// AlreadyExists, the answer to a retried create whose first attempt was
// stored but whose answer was lost.
func (t *APITransport) FailAfterWriteWith(m Match, n, code int, reason metav1.StatusReason, message string) Rule {
	return t.add(&rule{match: m, nth: n, times: 1, code: code, reason: reason, message: message, after: true})
}

// Fired returns how often the rule has acted so far.
func (t *APITransport) Fired(r Rule) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return r.r.fired
}

// Delay holds every request matching m for d before sending it.
func (t *APITransport) Delay(m Match, d time.Duration) Rule {
	return t.add(&rule{match: m, delay: d})
}

// Remove drops a rule; removing one twice is harmless.
func (t *APITransport) Remove(r Rule) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for i, x := range t.rules {
		if x == r.r {
			t.rules = append(t.rules[:i], t.rules[i+1:]...)
			return
		}
	}
}

func (t *APITransport) add(r *rule) Rule {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.rules = append(t.rules, r)
	return Rule{r}
}

// Partition cuts the client off the API server: every request (reads
// too) hangs up to the partition timeout (5s; SetPartitionTimeout) and
// then fails, and answers still in flight are dropped: an open watch
// stream ends with an error at its next read, and no event that arrives
// after the cut reaches the client. Heal ends it.
func (t *APITransport) Partition() { t.partitioned.Store(true) }

// Heal ends a Partition.
func (t *APITransport) Heal() { t.partitioned.Store(false) }

// Partitioned reports whether the client is cut off.
func (t *APITransport) Partitioned() bool { return t.partitioned.Load() }

// SetPartitionTimeout sets how long a request hangs in a partition
// before it fails. Call before the client starts.
func (t *APITransport) SetPartitionTimeout(d time.Duration) { t.partitionTimeout = d }

// Wrap is a rest.Config WrapTransport.
func (t *APITransport) Wrap(rt http.RoundTripper) http.RoundTripper {
	return RoundTripFunc(func(req *http.Request) (*http.Response, error) {
		if t.partitioned.Load() {
			// A cut connection times out eventually; client-go sets no
			// timeout of its own, so bound the hang here.
			select {
			case <-req.Context().Done():
				return nil, req.Context().Err()
			case <-time.After(t.partitionTimeout):
				return nil, errors.New("connection timed out (partitioned)")
			}
		}
		p := parsePath(req.URL.Path)
		if req.Method == http.MethodPost && p.name == "" && t.matchesByName() {
			name, err := createdName(req)
			if err != nil {
				return nil, err
			}
			p.created = name
		}
		before, after := t.pick(req.Method, p)
		if before != nil && before.delay > 0 {
			select {
			case <-req.Context().Done():
				return nil, req.Context().Err()
			case <-time.After(before.delay):
			}
		} else if before != nil {
			resp := statusResponse(req, before.code, before.reason, before.message)
			t.countSent(req.Method, p)
			t.record(req, p, resp.StatusCode, nil, true, peekBody(resp))
			return resp, nil
		}
		t.countSent(req.Method, p)
		resp, err := rt.RoundTrip(req)
		if err == nil && t.partitioned.Load() {
			// Cut while the request was in flight (a watch): drop it.
			resp.Body.Close()
			err, resp = errors.New("connection cut"), nil
		}
		code := 0
		var body []byte
		if err == nil {
			code = resp.StatusCode
			if code >= 400 && req.Method != http.MethodGet {
				body = peekBody(resp)
			}
		}
		t.record(req, p, code, err, false, body)
		if code == http.StatusUnauthorized || code == http.StatusForbidden {
			t.mu.Lock()
			t.denied = append(t.denied, fmt.Sprintf("%d %s %s", code, req.Method, req.URL.Path))
			t.mu.Unlock()
		}
		if after != nil && err == nil {
			resp.Body.Close()
			if after.code == 0 {
				return nil, fmt.Errorf("connection reset after the write (injected): %s", after.message)
			}
			return statusResponse(req, after.code, after.reason, after.message), nil
		}
		if err == nil && req.Method == http.MethodGet && req.URL.Query().Get("watch") == "true" {
			resp.Body = newLaggingBody(resp.Body, func() bool { return t.lagging(p) }, t.partitioned.Load)
		}
		return resp, err
	})
}

// pick returns the rule that acts before the request (a delay or an
// injected answer) and the one that acts after it, counting matches.
func (t *APITransport) pick(method string, p parsedPath) (before, after *rule) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, r := range t.rules {
		if r.lag || !r.match.matches(method, p) || (r.times > 0 && r.fired >= r.times) {
			continue
		}
		r.seen++
		if r.nth > 0 && r.seen != r.nth {
			continue
		}
		switch {
		case r.after && after == nil:
			r.fired++
			after = r
		case !r.after && before == nil:
			r.fired++
			before = r
		}
	}
	return before, after
}

func (t *APITransport) record(req *http.Request, p parsedPath, code int, err error, injected bool, body []byte) {
	if req.Method == http.MethodGet {
		return
	}
	w := Write{
		Method: req.Method, Resource: p.resource, Subresource: p.subresource,
		Namespace: p.namespace, Name: p.name, Path: req.URL.Path,
		Code: code, Err: err, Injected: injected, At: time.Now(), Body: body,
	}
	if st := decodeStatus(body); st != nil {
		w.Reason, w.Message = st.Reason, st.Message
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.writes = append(t.writes, w)
}

// maxBody bounds the part of a failed write's answer a Write keeps.
const maxBody = 64 << 10

// peekBody returns the first maxBody bytes of resp's body and leaves the
// body whole for the client to read.
func peekBody(resp *http.Response) []byte {
	head, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		// The client reads what there was and the same error.
		resp.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(head), errReader{err}), resp.Body}
		return head
	}
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(head), resp.Body), resp.Body}
	return head
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

// decodeStatus reads the metav1.Status of an API error answer, as
// client-go does (JSON or protobuf); nil when body is not one.
func decodeStatus(body []byte) *metav1.Status {
	if len(body) == 0 {
		return nil
	}
	obj, err := runtime.Decode(scheme.Codecs.UniversalDeserializer(), body)
	if err != nil {
		return nil
	}
	st, _ := obj.(*metav1.Status)
	return st
}

// Denied returns every request of any verb, reads and watches included,
// that the API server refused as unauthorized or forbidden (401, 403),
// as "CODE METHOD path", in order. Answers a fault rule injected are not
// in it. RBAC tests check that it stays empty.
func (t *APITransport) Denied() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]string(nil), t.denied...)
}

// Writes returns the writes so far, in order.
func (t *APITransport) Writes() []Write {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]Write(nil), t.writes...)
}

// countSent counts a write as it is sent.
func (t *APITransport) countSent(method string, p parsedPath) {
	if method == http.MethodGet {
		return
	}
	key := Write{Method: method, Resource: p.resource, Subresource: p.subresource}.Key()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.sent == nil {
		t.sent = map[string]int{}
	}
	t.sent[key]++
}

// Counts returns how many writes were sent, by Key, whatever their
// answer. A write counts from the moment it is sent: a test that saw its
// effect on the server (which happens before the writer's client reads
// the answer) finds it counted. Writes, which carry the answers, lists a
// write only once it is answered.
func (t *APITransport) Counts() map[string]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return maps.Clone(t.sent)
}

// Count returns how many writes with key ("PATCH volumeattachments") were
// sent.
func (t *APITransport) Count(key string) int { return t.Counts()[key] }

// statusResponse is an API error answer as the server sends it: a
// metav1.Status in JSON, which client-go turns into an errors.StatusError.
// An empty reason is the one the API server gives code.
func statusResponse(req *http.Request, code int, reason metav1.StatusReason, message string) *http.Response {
	if reason == "" {
		reason = reasonOf(code)
	}
	if message == "" {
		message = "injected by the test: " + strings.ToLower(http.StatusText(code))
	}
	body := fmt.Sprintf(`{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":%q,"reason":%q,"code":%d}`, message, reason, code)
	return &http.Response{
		StatusCode: code, Status: fmt.Sprintf("%d %s", code, http.StatusText(code)),
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        http.Header{"Content-Type": []string{"application/json"}},
		Body:          io.NopCloser(strings.NewReader(body)),
		ContentLength: int64(len(body)), Request: req,
	}
}

// reasonOf is the metav1.StatusReason the API server gives a status code.
func reasonOf(code int) metav1.StatusReason {
	switch code {
	case http.StatusConflict:
		return "Conflict"
	case http.StatusNotFound:
		return "NotFound"
	case http.StatusForbidden:
		return "Forbidden"
	case http.StatusUnauthorized:
		return "Unauthorized"
	case http.StatusUnprocessableEntity:
		return "Invalid"
	case http.StatusTooManyRequests:
		return "TooManyRequests"
	case http.StatusGatewayTimeout:
		return "Timeout"
	case http.StatusServiceUnavailable:
		return "ServiceUnavailable"
	case http.StatusInternalServerError:
		return "InternalError"
	case http.StatusBadRequest:
		return "BadRequest"
	}
	return ""
}
