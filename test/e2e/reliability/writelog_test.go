package reliability_test

import (
	"bytes"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/latchcsi/latch/internal/testsupport"
)

// writeLog holds the API transports of every controller the test starts
// (each transport records its client's writes with the API server's
// answer) and finds, over the whole run, the writes the API server
// rejected with 400, 403, 413 or 422: the kind of failure a retry never
// fixes, so unless the controller shows it somewhere else (an
// attachError, an event), nobody ever learns of it. Conflicts (409) and
// NotFound (404) are the normal answers of optimistic concurrency and do
// not count; neither do failures without an answer (a restarting API
// server, a cut connection), which the controllers retry.
type writeLog struct {
	mu      sync.Mutex
	sources []writeSource
}

type writeSource struct {
	component string
	api       *testsupport.APITransport
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

// add watches the writes of component through api.
func (l *writeLog) add(component string, api *testsupport.APITransport) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sources = append(l.sources, writeSource{component, api})
}

// rejected is one write the API server refused as invalid.
type rejected struct {
	component string
	testsupport.Write
}

// rejected returns the writes refused as invalid, in the order answered.
func (l *writeLog) rejected() []rejected {
	l.mu.Lock()
	sources := slices.Clone(l.sources)
	l.mu.Unlock()
	var out []rejected
	for _, s := range sources {
		for _, w := range s.api.Writes() {
			if w.Err != nil || !invalidCodes[w.Code] {
				continue
			}
			if w.Code == http.StatusUnprocessableEntity && patchNotApplicable(w.Body) {
				// A guarded JSON patch whose "test" operation no longer
				// matched: the object changed since the controller read
				// it, the same answer as a 409, retried on a fresher read.
				continue
			}
			out = append(out, rejected{s.component, w})
		}
	}
	slices.SortStableFunc(out, func(a, b rejected) int { return a.At.Compare(b.At) })
	return out
}

// problems lists the rejected writes, at most max of them.
func (l *writeLog) problems(max int) (total int, out []string) {
	all := l.rejected()
	for i, r := range all {
		if i == max {
			out = append(out, fmt.Sprintf("... and %d more", len(all)-max))
			break
		}
		body := r.Body
		if len(body) > 600 {
			body = append(body[:600:600], "…"...)
		}
		out = append(out, fmt.Sprintf("%s %s %s at %s: %d %s", r.component, r.Method, r.Path, r.At.Format(time.StampMicro), r.Code, body))
	}
	return len(all), out
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
