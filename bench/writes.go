package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/latchcsi/latch/internal/app"
	"github.com/latchcsi/latch/internal/kube/kubetest"
)

// Writes counts API writes by "VERB resource[/subresource]", e.g.
// "PATCH volumeattachments/status".
type Writes map[string]int

// Sub returns w - o, dropping keys that end up zero.
func (w Writes) Sub(o Writes) Writes {
	out := Writes{}
	for k, v := range w {
		if d := v - o[k]; d != 0 {
			out[k] = d
		}
	}
	for k, v := range o {
		if _, ok := w[k]; !ok && v != 0 {
			out[k] = -v
		}
	}
	return out
}

// Total is the sum of all counts.
func (w Writes) Total() int {
	n := 0
	for _, v := range w {
		n += v
	}
	return n
}

// Resource sums the counts of every verb on one resource[/subresource].
func (w Writes) Resource(res string) int {
	n := 0
	for k, v := range w {
		if _, r, _ := strings.Cut(k, " "); r == res {
			n += v
		}
	}
	return n
}

// apiWrites reads the API server's own request counter
// (apiserver_request_total) and returns its write verbs by resource. It
// counts every client's writes, which is what lets the harness measure a
// csi-attacher running as a separate process, whatever its implementation:
// the harness subtracts the writes it made itself (see countingConfig).
func apiWrites(ctx context.Context, client kubernetes.Interface) (Writes, error) {
	raw, err := client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the API server's metrics: %w", err)
	}
	return parseRequestTotals(raw)
}

// parseRequestTotals sums apiserver_request_total samples of write verbs.
func parseRequestTotals(text []byte) (Writes, error) {
	out := Writes{}
	sc := bufio.NewScanner(bytes.NewReader(text))
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, "apiserver_request_total{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		if !ok {
			return nil, fmt.Errorf("malformed sample %q", line)
		}
		l := parseLabels(labels)
		if !isWriteVerb(l["verb"]) {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return nil, fmt.Errorf("malformed value in %q: %w", line, err)
		}
		res := l["resource"]
		if l["subresource"] != "" {
			res += "/" + l["subresource"]
		}
		out[l["verb"]+" "+res] += int(v)
	}
	return out, sc.Err()
}

func parseLabels(s string) map[string]string {
	out := map[string]string{}
	for s != "" {
		name, rest, ok := strings.Cut(s, "=\"")
		if !ok {
			break
		}
		end := strings.Index(rest, "\"")
		if end < 0 {
			break
		}
		out[name] = rest[:end]
		s = strings.TrimPrefix(rest[end+1:], ",")
	}
	return out
}

func isWriteVerb(v string) bool {
	switch v {
	case "POST", "PUT", "PATCH", "DELETE", "APPLY", "DELETECOLLECTION", "CREATE", "UPDATE":
		return true
	}
	return false
}

// writeCounter counts the writes one client makes, by the same keys as the
// API server's counter, so they can be told apart from a component's.
type writeCounter struct {
	mu     sync.Mutex
	counts Writes
}

func newWriteCounter() *writeCounter { return &writeCounter{counts: Writes{}} }

func (w *writeCounter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		if req.Method != http.MethodGet {
			key := req.Method + " " + resourceOf(req.URL.Path)
			w.mu.Lock()
			w.counts[key]++
			w.mu.Unlock()
		}
		return rt.RoundTrip(req)
	})
}

func (w *writeCounter) snapshot() Writes {
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.counts)
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// resourceOf turns an API path into resource[/subresource]:
// /api/v1/namespaces/ns/pods/p/status → "pods/status",
// /apis/storage.k8s.io/v1/volumeattachments → "volumeattachments".
func resourceOf(path string) string {
	res, sub := kubetest.ResourceOfPath(path)
	if sub != "" {
		return res + "/" + sub
	}
	return res
}

// countingConfig returns a copy of cfg without client-side rate limits whose
// writes are counted by c. It speaks protobuf, as the clients the harness
// stands in for (kube-controller-manager creating VolumeAttachments, the
// kubelet) and latch's components do.
func countingConfig(cfg *rest.Config, c *writeCounter, userAgent string) *rest.Config {
	out := app.ComponentConfig(cfg, userAgent)
	out.QPS = -1
	out.Burst = 0
	out.UserAgent = userAgent
	prev := out.WrapTransport
	out.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		if prev != nil {
			rt = prev(rt)
		}
		return c.wrap(rt)
	}
	return out
}
