package app

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/latchcsi/latch/internal/testsupport"
)

// An operator's dashboard of API traffic (kube-controller-manager's and the
// external-attacher's rest_client_* panels) reads the requests every client
// of the binaries makes, by answer code, and how long the client-side rate
// limit held them: two GETs through a client limited to 5 requests a
// second with a burst of 1, one found and one not, show up on the metrics
// endpoint both binaries serve.
func TestRESTClientMetrics_countRequestsByCodeAndTheWaitForTheClientSideLimit(t *testing.T) {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/api/v1/namespaces/ns/configmaps/found" {
			_, _ = w.Write([]byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"found","namespace":"ns"}}`))
			return
		}
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"apiVersion":"v1","kind":"Status","status":"Failure","reason":"NotFound","code":404}`))
	}))
	defer api.Close()
	host := api.Listener.Addr().String() // client-go's host label: the URL's host:port

	client, err := kubernetes.NewForConfig(&rest.Config{Host: api.URL, QPS: 5, Burst: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := client.CoreV1().ConfigMaps("ns").Get(ctx, "found", metav1.GetOptions{}); err != nil {
		t.Fatalf("get found: %v", err)
	}
	if _, err := client.CoreV1().ConfigMaps("ns").Get(ctx, "missing", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("get missing: got %v, want NotFound", err)
	}

	addr, err := ServeHTTP(ctx, HTTPConfig{Address: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	samples, err := testsupport.Scrape(ctx, "http://"+addr.String()+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		min    float64
	}{
		{"rest_client_requests_total", map[string]string{"host": host, "method": "GET", "code": "200"}, 1},
		{"rest_client_requests_total", map[string]string{"host": host, "method": "GET", "code": "404"}, 1},
		{"rest_client_request_duration_seconds_count", map[string]string{"host": host, "verb": "GET"}, 2},
		{"rest_client_rate_limiter_duration_seconds_count", map[string]string{"host": host, "verb": "GET"}, 2},
		// The second GET waited for the bucket's next token (1/5 s).
		{"rest_client_rate_limiter_duration_seconds_sum", map[string]string{"host": host, "verb": "GET"}, 0.1},
	} {
		v, ok := samples.Value(c.name, c.labels)
		if !ok || v < c.min {
			t.Errorf("%s %v = %v (found: %v), want at least %v", c.name, c.labels, v, ok, c.min)
		}
	}
}
