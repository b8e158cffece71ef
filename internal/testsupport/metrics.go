package testsupport

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
)

// Sample is one sample of a metric.
type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// Samples is a scrape's samples, in order.
type Samples []Sample

// Find returns the samples named name whose labels include want (nil
// matches any labels).
func (s Samples) Find(name string, want map[string]string) Samples {
	var out Samples
next:
	for _, x := range s {
		if x.Name != name {
			continue
		}
		for k, v := range want {
			if x.Labels[k] != v {
				continue next
			}
		}
		out = append(out, x)
	}
	return out
}

// Value is the sum of the samples named name whose labels include want;
// ok is false when none match.
func (s Samples) Value(name string, want map[string]string) (v float64, ok bool) {
	m := s.Find(name, want)
	for _, x := range m {
		v += x.Value
	}
	return v, len(m) > 0
}

// ParseText parses the Prometheus text exposition format. Comments and
// blank lines are skipped; a sample line it cannot read is an error
// naming the line.
func ParseText(text []byte) (Samples, error) {
	var out Samples
	sc := bufio.NewScanner(bytes.NewReader(text))
	sc.Buffer(make([]byte, 0, 64*1024), 4*1024*1024)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		s, err := parseSample(line)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, sc.Err()
}

func parseSample(line string) (Sample, error) {
	s := Sample{Labels: map[string]string{}}
	rest := line
	if i := strings.IndexByte(line, '{'); i >= 0 {
		end := strings.LastIndexByte(line, '}')
		if end < i {
			return s, fmt.Errorf("malformed sample %q: unclosed labels", line)
		}
		s.Name = line[:i]
		if err := parseLabels(line[i+1:end], s.Labels); err != nil {
			return s, fmt.Errorf("malformed sample %q: %w", line, err)
		}
		rest = strings.TrimSpace(line[end+1:])
	} else {
		name, r, ok := strings.Cut(line, " ")
		if !ok {
			return s, fmt.Errorf("malformed sample %q: no value", line)
		}
		s.Name, rest = name, strings.TrimSpace(r)
	}
	// A timestamp may follow the value.
	value, _, _ := strings.Cut(rest, " ")
	v, err := strconv.ParseFloat(value, 64)
	if err != nil {
		return s, fmt.Errorf("malformed value in %q: %w", line, err)
	}
	s.Value = v
	return s, nil
}

// parseLabels reads name="value",... with the format's escapes (\\, \",
// \n) into into.
func parseLabels(s string, into map[string]string) error {
	for {
		s = strings.TrimLeft(s, ", ")
		if s == "" {
			return nil
		}
		name, rest, ok := strings.Cut(s, "=\"")
		if !ok {
			return fmt.Errorf("label without a quoted value at %q", s)
		}
		var b strings.Builder
		i := 0
		for ; i < len(rest) && rest[i] != '"'; i++ {
			if rest[i] == '\\' && i+1 < len(rest) {
				i++
				if rest[i] == 'n' {
					b.WriteByte('\n')
					continue
				}
			}
			b.WriteByte(rest[i])
		}
		if i >= len(rest) {
			return fmt.Errorf("unterminated value of label %s", name)
		}
		into[strings.TrimSpace(name)] = b.String()
		s = rest[i+1:]
	}
}

// Scrape GETs url and parses its Prometheus text.
func Scrape(ctx context.Context, url string) (Samples, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: status %d", url, resp.StatusCode)
	}
	return ParseText(body)
}

// Gatherer is what a Prometheus or component-base registry offers.
type Gatherer interface {
	Gather() ([]*dto.MetricFamily, error)
}

// Gather reads a registry's counters, gauges and untyped metrics (a
// histogram or summary gives its _count and _sum) as samples.
func Gather(g Gatherer) (Samples, error) {
	families, err := g.Gather()
	if err != nil {
		return nil, err
	}
	var out Samples
	for _, f := range families {
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			add := func(name string, v float64) {
				out = append(out, Sample{Name: name, Labels: labels, Value: v})
			}
			switch {
			case m.Counter != nil:
				add(f.GetName(), m.GetCounter().GetValue())
			case m.Gauge != nil:
				add(f.GetName(), m.GetGauge().GetValue())
			case m.Untyped != nil:
				add(f.GetName(), m.GetUntyped().GetValue())
			case m.Histogram != nil:
				add(f.GetName()+"_count", float64(m.GetHistogram().GetSampleCount()))
				add(f.GetName()+"_sum", m.GetHistogram().GetSampleSum())
			case m.Summary != nil:
				add(f.GetName()+"_count", float64(m.GetSummary().GetSampleCount()))
				add(f.GetName()+"_sum", m.GetSummary().GetSampleSum())
			}
		}
	}
	return out, nil
}
