package main

import (
	"errors"
	"io"
	"testing"

	"github.com/latchcsi/latch/internal/diagnose"
	"github.com/latchcsi/latch/internal/diagnose/render"
)

func TestParseArgs(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want Config // only the fields checked below
	}{
		{"pod with namespace in the name", []string{"explain", "pod", "ns1/web"},
			Config{Command: "explain", Target: diagnose.Target{Kind: diagnose.TargetPod, Namespace: "ns1", Name: "web"}, Output: render.Text}},
		{"pod with -n after the name (flags are interspersed)", []string{"explain", "po", "web", "-n", "ns1", "-o", "json"},
			Config{Command: "explain", Target: diagnose.Target{Kind: diagnose.TargetPod, Namespace: "ns1", Name: "web"}, Output: render.JSON}},
		{"kubectl-style kind/name", []string{"explain", "pvc/data"},
			Config{Command: "explain", Target: diagnose.Target{Kind: diagnose.TargetPVC, Name: "data"}, Output: render.Text}},
		{"pv ignores -n", []string{"explain", "persistentvolume", "pv-1", "-n", "x"},
			Config{Command: "explain", Target: diagnose.Target{Kind: diagnose.TargetPV, Name: "pv-1"}, Output: render.Text}},
		{"va", []string{"explain", "va", "csi-12"},
			Config{Command: "explain", Target: diagnose.Target{Kind: diagnose.TargetVA, Name: "csi-12"}, Output: render.Text}},
		{"status defaults", []string{"status"},
			Config{Command: "status", Output: render.Table, SortBy: diagnose.SortDriver}},
		{"status flags", []string{"status", "--sort-by=age", "--driver", "d", "-o", "wide", "--context", "c"},
			Config{Command: "status", Output: render.Wide, SortBy: diagnose.SortAge, Driver: "d", Kube: KubeConfig{Context: "c"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseArgs(tc.args, "latchctl", io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if got.Command != tc.want.Command || got.Target != tc.want.Target || got.Output != tc.want.Output ||
				(tc.want.SortBy != "" && got.SortBy != tc.want.SortBy) || got.Driver != tc.want.Driver || got.Kube.Context != tc.want.Kube.Context {
				t.Errorf("parseArgs(%q) = %+v, want %+v", tc.args, *got, tc.want)
			}
		})
	}
}

func TestParseArgsRejects(t *testing.T) {
	for _, args := range [][]string{
		{"explain", "pod"}, {"explain", "pod", "a", "b"}, {"explain", "pod", "ns/"}, {"explain", "svc", "x"},
		{"explain", "va", "a/b"}, {"explain", "pod", "a/x", "-n", "b"}, {"explain", "pod", "x", "-o", "wide"},
		{"status", "extra"}, {"status", "--sort-by", "size"}, {"--nope"},
	} {
		if _, err := parseArgs(args, "latchctl", io.Discard); !errors.Is(err, errUsage) {
			t.Errorf("parseArgs(%q) error = %v, want a usage error", args, err)
		}
	}
}

func TestProgramName(t *testing.T) {
	for argv0, want := range map[string]string{
		"latchctl": "latchctl", "/usr/bin/latchctl": "latchctl", "/home/u/bin/kubectl-latch": "kubectl latch",
		`C:\bin\kubectl-latch.exe`: "kubectl latch", "./anything": "latchctl",
	} {
		if got := programName(argv0); got != want {
			t.Errorf("programName(%q) = %q, want %q", argv0, got, want)
		}
	}
}
