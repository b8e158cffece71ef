package reliability_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/latchcsi/latch/internal/testsupport"
)

// rejectedWrite is one write of a controller that the API server refused
// as invalid: the kind of failure a retry never fixes, so unless the
// controller shows it somewhere else (an attachError, an event), nobody
// ever learns of it.
type rejectedWrite struct {
	component, method, path string
	code                    int
	body                    string
	at                      time.Time
}

// writeLog sits in the controllers' API transports (behind their gates)
// and keeps every write the API server rejected with 400, 403, 413 or
// 422. Conflicts (409) and NotFound (404) are the normal answers of
// optimistic concurrency and are not kept; neither are failures without
// an answer (a restarting API server, a cut connection), which the
// controllers retry.
type writeLog struct {
	mu       sync.Mutex
	rejected []rejectedWrite
	writes   int
}

// invalidCodes are the answers that mean "this write will never be
// accepted as it is" (except a 422 for a failed JSON patch "test"
// operation, which is a precondition like a 409's).
var invalidCodes = map[int]bool{
	http.StatusBadRequest:            true,
	http.StatusForbidden:             true,
	http.StatusRequestEntityTooLarge: true,
	http.StatusUnprocessableEntity:   true,
}

func (l *writeLog) wrap(component string) func(http.RoundTripper) http.RoundTripper {
	return func(rt http.RoundTripper) http.RoundTripper {
		return testsupport.RoundTripFunc(func(req *http.Request) (*http.Response, error) {
			resp, err := rt.RoundTrip(req)
			if req.Method == http.MethodGet || err != nil {
				return resp, err
			}
			l.mu.Lock()
			l.writes++
			l.mu.Unlock()
			if !invalidCodes[resp.StatusCode] {
				return resp, err
			}
			// Keep the API server's answer for the report, and give the
			// client an identical body to read.
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
			resp.Body = io.NopCloser(bytes.NewReader(body))
			if resp.StatusCode == http.StatusUnprocessableEntity && patchNotApplicable(body) {
				// A guarded JSON patch whose "test" operation no longer
				// matched: the object changed since the controller read it,
				// the same answer as a 409, retried on a fresher read.
				return resp, nil
			}
			if len(body) > 600 {
				body = append(body[:600], "…"...)
			}
			l.mu.Lock()
			l.rejected = append(l.rejected, rejectedWrite{
				component: component, method: req.Method, path: req.URL.Path,
				code: resp.StatusCode, body: string(body), at: time.Now(),
			})
			l.mu.Unlock()
			return resp, nil
		})
	}
}

// problems lists the rejected writes, at most max of them.
func (l *writeLog) problems(max int) (total int, out []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, r := range l.rejected {
		if i == max {
			out = append(out, fmt.Sprintf("... and %d more", len(l.rejected)-max))
			break
		}
		out = append(out, fmt.Sprintf("%s %s %s at %s: %d %s", r.component, r.method, r.path, r.at.Format(time.StampMicro), r.code, r.body))
	}
	return len(l.rejected), out
}

// patchNotApplicable reports whether a 422's body is the API server's
// answer to a JSON patch it could not apply (a "test" operation that no
// longer matches the object): the generic "rejected our request" message
// with no field errors, unlike a validation failure, whose message names
// the object and says it "is invalid". Bodies come as JSON or protobuf;
// both carry the messages as plain text.
func patchNotApplicable(body []byte) bool {
	if bytes.Contains(body, []byte("test failed")) {
		return true
	}
	return bytes.Contains(body, []byte("the server rejected our request due to an error in our request")) &&
		!bytes.Contains(body, []byte("is invalid"))
}
