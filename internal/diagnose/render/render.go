// Package render prints diagnose reports and status rows as text, JSON or
// YAML. It only formats; it decides nothing.
package render

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/latchcsi/latch/internal/diagnose"
)

// Format is an output format (-o).
type Format string

const (
	Text  Format = "text" // explain's default
	Table Format = "table"
	Wide  Format = "wide"
	JSON  Format = "json"
	YAML  Format = "yaml"
)

// ExplainFormats and StatusFormats list what each command accepts.
func ExplainFormats() []Format { return []Format{Text, JSON, YAML} }
func StatusFormats() []Format  { return []Format{Table, Wide, JSON, YAML} }

// explainDoc is the machine-readable shape of a report. It is a contract
// for scripts: fields are only ever added.
type explainDoc struct {
	Target   diagnose.Target    `json:"target"`
	Healthy  bool               `json:"healthy"`
	Problems int                `json:"problems"`
	Waiting  int                `json:"waiting"`
	Findings []diagnose.Finding `json:"findings"`
}

// Report writes an explanation.
func Report(w io.Writer, r diagnose.Report, f Format) error {
	switch f {
	case JSON, YAML:
		doc := explainDoc{Target: r.Target, Healthy: r.Healthy(), Problems: r.Problems(), Waiting: r.Waiting(), Findings: r.Findings}
		if doc.Findings == nil {
			doc.Findings = []diagnose.Finding{}
		}
		return encode(w, doc, f)
	case Text, "":
		return reportText(w, r)
	}
	return fmt.Errorf("unknown output format %q for explain (want one of %v)", f, ExplainFormats())
}

func reportText(w io.Writer, r diagnose.Report) error {
	ew := &errWriter{w: w}
	ew.printf("Explaining %s\n\n", r.Target)
	for _, f := range r.Findings {
		subject := ""
		if f.Object != "" {
			subject = f.Object + ": "
		}
		ew.printf("%-8s %s%s\n", strings.ToUpper(string(f.Status)), subject, f.Message)
		if f.Hint != "" && (f.Status == diagnose.StatusProblem || f.Status == diagnose.StatusWaiting) {
			ew.printf("%-8s   next: %s\n", "", f.Hint)
		}
	}
	ew.printf("\n%s\n", r.Summary())
	return ew.err
}

// statusDoc is the machine-readable shape of `status`.
type statusDoc struct {
	Items []diagnose.Row `json:"items"`
	// Findings are about all VolumeAttachments together
	// (diagnose.StatusFindings); absent when there are none.
	Findings []diagnose.Finding `json:"findings,omitempty"`
}

// shortName is how many characters of a VolumeAttachment name the table
// shows: "csi-" and 16 hex digits are unique in practice, and `explain va`
// accepts a unique prefix.
const shortName = 20

// maxExcerpt bounds the error excerpt in the table.
const maxExcerpt = 60

// Status writes VolumeAttachment rows.
func Status(w io.Writer, rows []diagnose.Row, f Format) error {
	return StatusWithFindings(w, rows, nil, f)
}

// StatusWithFindings writes VolumeAttachment rows, then the findings about
// them all (in the table formats, one line each with its next step).
func StatusWithFindings(w io.Writer, rows []diagnose.Row, findings []diagnose.Finding, f Format) error {
	switch f {
	case JSON, YAML:
		if rows == nil {
			rows = []diagnose.Row{}
		}
		return encode(w, statusDoc{Items: rows, Findings: findings}, f)
	case Table, Wide, "":
		if err := statusTable(w, rows, f == Wide); err != nil {
			return err
		}
		return findingLines(w, findings)
	}
	return fmt.Errorf("unknown output format %q for status (want one of %v)", f, StatusFormats())
}

// findingLines writes findings after a blank line, as explain's text does.
func findingLines(w io.Writer, findings []diagnose.Finding) error {
	if len(findings) == 0 {
		return nil
	}
	ew := &errWriter{w: w}
	ew.printf("\n")
	for _, f := range findings {
		subject := ""
		if f.Object != "" {
			subject = f.Object + ": "
		}
		ew.printf("%-8s %s%s\n", strings.ToUpper(string(f.Status)), subject, f.Message)
		if f.Hint != "" {
			ew.printf("%-8s   next: %s\n", "", f.Hint)
		}
	}
	return ew.err
}

func statusTable(w io.Writer, rows []diagnose.Row, wide bool) error {
	if len(rows) == 0 {
		_, err := fmt.Fprintln(w, "No VolumeAttachments found.")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	ew := &errWriter{w: tw}
	ew.printf("NAME\tDRIVER\tNODE\tPV\tSTATE\tAGE\tMESSAGE\n")
	for _, r := range rows {
		name, msg := r.Name, r.Error
		if !wide {
			// A prefix, not an ellipsis, so that it can be pasted into
			// `latchctl explain va`.
			name = name[:min(len(name), shortName)]
			msg = truncate(oneLine(msg), maxExcerpt)
		}
		if msg != "" {
			msg = fmt.Sprintf("(%s ago) %s", diagnose.HumanDuration(time.Duration(r.ErrorAgeSeconds)*time.Second), msg)
		}
		ew.printf("%s\t%s\t%s\t%s\t%s\t%s\t%s\n", name, r.Driver, r.Node, orDash(r.PersistentVolume), r.State,
			diagnose.HumanDuration(r.Age()), orDash(msg))
	}
	if ew.err != nil {
		return ew.err
	}
	return tw.Flush()
}

func encode(w io.Writer, v any, f Format) error {
	if f == YAML {
		out, err := yaml.Marshal(v)
		if err != nil {
			return fmt.Errorf("encode YAML: %w", err)
		}
		_, err = w.Write(out)
		return err
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func truncate(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// errWriter keeps the first write error so that printing code stays flat.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) printf(format string, args ...any) {
	if e.err == nil {
		_, e.err = fmt.Fprintf(e.w, format, args...)
	}
}
