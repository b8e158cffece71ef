package testsupport

import (
	"bytes"
	"encoding/json"
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
// holds nothing more reaches the reader (data that arrives meanwhile is
// kept).
type laggingBody struct {
	rc      io.ReadCloser
	lagging func() bool
	chunks  chan []byte
	err     error // set before chunks is closed
	pending []byte
	closed  chan struct{}
	once    sync.Once
}

func newLaggingBody(rc io.ReadCloser, lagging func() bool) *laggingBody {
	b := &laggingBody{rc: rc, lagging: lagging, chunks: make(chan []byte), closed: make(chan struct{})}
	go b.pump()
	return b
}

// pump reads the stream and hands it to Read chunk by chunk, so that a
// Read waiting for data or for the lag to end returns once the body is
// closed.
func (b *laggingBody) pump() {
	for {
		buf := make([]byte, 32<<10)
		n, err := b.rc.Read(buf)
		if n > 0 {
			select {
			case b.chunks <- buf[:n]:
			case <-b.closed:
				return
			}
		}
		if err != nil {
			b.err = err
			close(b.chunks)
			return
		}
	}
}

func (b *laggingBody) Read(p []byte) (int, error) {
	if len(b.pending) == 0 {
		select {
		case c, ok := <-b.chunks:
			if !ok {
				return 0, b.err
			}
			b.pending = c
		case <-b.closed:
			return 0, io.EOF
		}
	}
	for b.lagging() {
		select {
		case <-b.closed:
			return 0, io.EOF
		case <-time.After(5 * time.Millisecond):
		}
	}
	n := copy(p, b.pending)
	b.pending = b.pending[n:]
	return n, nil
}

func (b *laggingBody) Close() error {
	b.once.Do(func() { close(b.closed) })
	return b.rc.Close()
}
