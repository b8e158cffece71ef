package render

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/latchcsi/latch/internal/diagnose"
)

var report = diagnose.Report{
	Target: diagnose.Target{Kind: diagnose.TargetPod, Namespace: "app", Name: "web"},
	Findings: []diagnose.Finding{
		{Check: "pod.scheduled", Object: "Pod app/web", Status: diagnose.StatusOK, Message: "Pod is scheduled to node n1", Hint: "not shown"},
		{Check: "va.attachError", Object: "VolumeAttachment csi-1", Status: diagnose.StatusProblem, Message: "attach failed", Hint: "read the logs"},
		{Check: "events", Status: diagnose.StatusInfo, Message: "Warning FailedMount", Hint: "not shown either"},
	},
}

func TestReportTextShowsHintsOnlyForProblemsAndWaiting(t *testing.T) {
	var b bytes.Buffer
	if err := Report(&b, report, Text); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"Explaining pod app/web", "OK       Pod app/web: Pod is scheduled", "PROBLEM  VolumeAttachment csi-1: attach failed", "next: read the logs", "1 problem found; 0 waiting"} {
		if !strings.Contains(out, want) {
			t.Errorf("text output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "not shown") {
		t.Errorf("hint of an ok/info finding printed:\n%s", out)
	}
}

func TestReportJSONIsTheDocumentedShape(t *testing.T) {
	var b bytes.Buffer
	if err := Report(&b, report, JSON); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Target   map[string]string
		Healthy  bool
		Problems int
		Findings []map[string]string
	}
	if err := json.Unmarshal(b.Bytes(), &doc); err != nil {
		t.Fatalf("%v\n%s", err, b.String())
	}
	if doc.Healthy || doc.Problems != 1 || len(doc.Findings) != 3 || doc.Findings[1]["check"] != "va.attachError" || doc.Target["kind"] != "pod" {
		t.Errorf("unexpected document: %+v", doc)
	}
}

func TestReportYAMLAndBadFormat(t *testing.T) {
	var b bytes.Buffer
	if err := Report(&b, report, YAML); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "check: va.attachError") {
		t.Errorf("YAML output:\n%s", b.String())
	}
	if err := Report(&b, report, Table); err == nil {
		t.Error("explain accepted -o table")
	}
}

func TestStatusTable(t *testing.T) {
	long := "csi-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	rows := []diagnose.Row{
		{Name: long, Driver: "a.csi", Node: "n1", PersistentVolume: "pv1", State: diagnose.StateFailing, AgeSeconds: 300,
			Error: "rpc error: code = Internal desc = " + strings.Repeat("x", 100), ErrorAgeSeconds: 30},
		{Name: "csi-2", Driver: "a.csi", Node: "n2", State: diagnose.StateAttached, AgeSeconds: 7200},
	}
	var b bytes.Buffer
	if err := Status(&b, rows, Table); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"NAME", "STATE", long[:shortName] + " ", "failing", "(30s ago) rpc error", "…", "attached", "120m"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, long) {
		t.Errorf("table shows the full name:\n%s", out)
	}
	b.Reset()
	if err := Status(&b, rows, Wide); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), long) || !strings.Contains(b.String(), strings.Repeat("x", 100)) {
		t.Errorf("wide output truncates:\n%s", b.String())
	}
	b.Reset()
	if err := Status(&b, nil, Table); err != nil || !strings.Contains(b.String(), "No VolumeAttachments") {
		t.Errorf("empty table = %q, %v", b.String(), err)
	}
	b.Reset()
	if err := Status(&b, nil, JSON); err != nil || !strings.Contains(b.String(), `"items": []`) {
		t.Errorf("empty JSON = %q, %v", b.String(), err)
	}
}
