package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/latchcsi/latch/internal/app"
	"github.com/latchcsi/latch/internal/localcluster"
	"github.com/latchcsi/latch/internal/testsupport"
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
	samples, err := testsupport.ParseText(text)
	if err != nil {
		return nil, err
	}
	out := Writes{}
	for _, s := range samples.Find("apiserver_request_total", nil) {
		if !isWriteVerb(s.Labels["verb"]) {
			continue
		}
		res := s.Labels["resource"]
		if s.Labels["subresource"] != "" {
			res += "/" + s.Labels["subresource"]
		}
		out[s.Labels["verb"]+" "+res] += int(s.Value)
	}
	return out, nil
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
type writeCounter struct{ api *testsupport.APITransport }

func newWriteCounter() *writeCounter { return &writeCounter{api: testsupport.NewAPITransport()} }

func (w *writeCounter) snapshot() Writes { return Writes(w.api.Counts()) }

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
		return c.api.Wrap(rt)
	}
	return out
}

// harnessClients returns the clients a run's own code uses: client's
// writes are counted by writes (so they can be told from the components'),
// admin's reads (watches, metrics) are not counted. Both speak protobuf, so
// that observing a run costs the shared API server as little as it can.
func harnessClients(cluster *localcluster.Cluster, name string) (client kubernetes.Interface, writes *writeCounter, admin kubernetes.Interface, err error) {
	cc := *cluster.RESTConfig()
	writes = newWriteCounter()
	if client, err = kubernetes.NewForConfig(countingConfig(&cc, writes, name)); err != nil {
		return nil, nil, nil, err
	}
	if admin, err = kubernetes.NewForConfig(app.ComponentConfig(cluster.RESTConfig(), name+"-observer")); err != nil {
		return nil, nil, nil, err
	}
	return client, writes, admin, nil
}

// newRunID is a random name suffix that keeps a run's objects and driver
// apart from an earlier run's on the same control plane.
func newRunID() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
