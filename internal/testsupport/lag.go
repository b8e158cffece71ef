package testsupport

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"
)

// LagWatches holds back the events of the client's watches that match m
// (its Method is ignored: watches are GETs) while the rule is in place:
// the client's informer lags behind the API server. Events that arrive
// meanwhile are kept, not lost, and reach the client in order once the
// rule is removed. Watches started before the call lag too.
func (t *APITransport) LagWatches(m Match) Rule {
	m.Method = http.MethodGet
	return t.add(&rule{match: m, lag: true})
}

// lagging reports whether a LagWatches rule matches the watch p.
func (t *APITransport) lagging(p parsedPath) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, r := range t.rules {
		if r.lag && r.match.matches(http.MethodGet, p) {
			return true
		}
	}
	return false
}

// matchesByName reports whether a fault rule names an object, so that a
// create's body must be read to match it.
func (t *APITransport) matchesByName() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, r := range t.rules {
		if !r.lag && r.match.Name != "" {
			return true
		}
	}
	return false
}

// createdName returns the name of the object a create sends (JSON or
// protobuf) and leaves the request's body whole; "" when it has none.
func createdName(req *http.Request) (string, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return "", nil
	}
	body, err := io.ReadAll(req.Body)
	_ = req.Body.Close()
	if err != nil {
		return "", fmt.Errorf("read the body of %s %s: %w", req.Method, req.URL.Path, err)
	}
	req.Body = io.NopCloser(bytes.NewReader(body))
	if obj, err := runtime.Decode(scheme.Codecs.UniversalDeserializer(), body); err == nil {
		if m, err := meta.Accessor(obj); err == nil {
			return m.GetName(), nil
		}
	}
	var partial struct {
		Metadata struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	if json.Unmarshal(body, &partial) == nil {
		return partial.Metadata.Name, nil
	}
	return "", nil
}

// laggingBody passes a watch stream through, except that while lagging()
// holds nothing more reaches the reader: what arrives meanwhile stays in
// the reader's buffer (or the connection's) and is handed over, in
// order, once the lag ends.
type laggingBody struct {
	rc      io.ReadCloser
	lagging func() bool
	// cut reports a partition: the stream ends with an error and nothing
	// read after the cut reaches the reader (nil: never).
	cut    func() bool
	closed chan struct{}
	once   sync.Once
}

func newLaggingBody(rc io.ReadCloser, lagging, cut func() bool) *laggingBody {
	return &laggingBody{rc: rc, lagging: lagging, cut: cut, closed: make(chan struct{})}
}

// errCut ends a watch stream cut by a partition.
var errCut = errors.New("connection cut (partitioned)")

// Read reads from the stream and returns what it read once the watch
// does not lag. Close ends a Read that waits, on the stream or the lag. A
// partition ends the stream: what arrives after the cut is dropped.
func (b *laggingBody) Read(p []byte) (int, error) {
	if b.cut != nil && b.cut() {
		b.Close()
		return 0, errCut
	}
	n, err := b.rc.Read(p)
	if b.cut != nil && b.cut() {
		b.Close()
		return 0, errCut
	}
	for b.lagging() {
		select {
		case <-b.closed:
			return 0, io.EOF
		case <-time.After(5 * time.Millisecond):
		}
	}
	return n, err
}

func (b *laggingBody) Close() error {
	b.once.Do(func() { close(b.closed) })
	return b.rc.Close()
}
