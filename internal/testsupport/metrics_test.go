package testsupport

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

const text = `# HELP apiserver_request_total Counter of apiserver requests.
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",resource="volumeattachments",subresource="",verb="POST"} 3
apiserver_request_total{code="200",resource="volumeattachments",subresource="status",verb="PATCH"} 4 1700000000
up 1
weird{msg="a \"quoted\", value"} 2.5
`

func TestParseTextReadsLabelsValuesAndEscapes(t *testing.T) {
	s, err := ParseText([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	if len(s) != 4 {
		t.Fatalf("%d samples, want 4: %+v", len(s), s)
	}
	if v, ok := s.Value("apiserver_request_total", nil); !ok || v != 7 {
		t.Errorf("sum = %v %v, want 7", v, ok)
	}
	if v, _ := s.Value("apiserver_request_total", map[string]string{"subresource": "status"}); v != 4 {
		t.Errorf("status = %v, want 4 (the timestamp is not the value)", v)
	}
	if v, ok := s.Value("up", nil); !ok || v != 1 {
		t.Errorf("up = %v %v", v, ok)
	}
	if got := s.Find("weird", nil); len(got) != 1 || got[0].Labels["msg"] != `a "quoted", value` {
		t.Errorf("weird = %+v", got)
	}
	if _, ok := s.Value("absent", nil); ok {
		t.Error("absent metric found")
	}
	if _, err := ParseText([]byte("broken{a=\"1\"} notanumber\n")); err == nil {
		t.Error("a malformed value parsed")
	}
}

func TestScrapeAndGatherAgree(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "things_total", Help: "x"}, []string{"kind"})
	reg.MustRegister(c)
	c.WithLabelValues("a").Add(2)
	c.WithLabelValues("b").Add(5)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				fmt.Fprintf(w, "%s{kind=%q} %v\n", mf.GetName(), m.GetLabel()[0].GetValue(), m.GetCounter().GetValue())
			}
		}
	}))
	defer srv.Close()
	scraped, err := Scrape(context.Background(), srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	gathered, err := Gather(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []Samples{scraped, gathered} {
		if v, _ := s.Value("things_total", map[string]string{"kind": "b"}); v != 5 {
			t.Errorf("things_total{kind=b} = %v, want 5", v)
		}
		if v, _ := s.Value("things_total", nil); v != 7 {
			t.Errorf("things_total = %v, want 7", v)
		}
	}
}
