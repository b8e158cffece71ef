package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// completeAs runs latchctl as kubectl runs a plugin's completer
// (kubectl_complete-latch WORD... CUR, KUBECONFIG in the environment) and
// returns the completions' words and the directive line.
func completeAs(t *testing.T, argv0 string, words ...string) ([]string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	if code := run(t.Context(), argv0, words, &out, &errOut, time.Now); code != exitHealthy {
		t.Fatalf("%s %q: exit %d: %s", argv0, words, code, errOut.String())
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	directive := lines[len(lines)-1]
	var got []string
	for _, l := range lines[:len(lines)-1] {
		got = append(got, strings.SplitN(l, "\t", 2)[0])
	}
	return got, directive
}

// latchctl under the name kubectl runs for `kubectl latch` completion
// (kubectl_complete-latch) answers Cobra's __complete protocol: one
// completion per line (with a tab and a description for commands and
// flags), then ":4" (no file names) or ":0" (file names, for
// --kubeconfig); the names of a kind's objects come from the API server
// that KUBECONFIG, --context and -n select. `latchctl __complete` answers
// the same.
func TestKubectlCompleterAnswersCobrasProtocol(t *testing.T) {
	f := newFixture(t, "complete")
	node := f.node("n1", true)
	f.pod("web-0", node)
	f.pod("web-1", node)
	pv := f.volume("data")
	f.va(pv, node, storagev1.VolumeAttachmentStatus{Attached: true})
	if _, err := f.client.StorageV1().CSIDrivers().Create(f.ctx, &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: f.driver}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBECONFIG", f.kubeconfig)

	for _, tc := range []struct {
		words     []string
		want      []string
		directive string
	}{
		{[]string{""}, []string{"explain", "status", "completion", "version", "help"}, ":4"},
		{[]string{"st"}, []string{"status"}, ":4"},
		{[]string{"explain", ""}, []string{"pod", "pvc", "pv", "va"}, ":4"},
		{[]string{"explain", "pv"}, []string{"pvc", "pv"}, ":4"},
		{[]string{"-n", f.ns, "explain", "pod", ""}, []string{"web-0", "web-1"}, ":4"},
		{[]string{"explain", "po", "--namespace=" + f.ns, "web-1"}, []string{"web-1"}, ":4"},
		{[]string{"explain", "pvc", "-n", f.ns, ""}, []string{pv.Name}, ":4"},
		{[]string{"explain", "pv", pv.Name[:len(pv.Name)-2]}, []string{pv.Name}, ":4"},
		{[]string{"-n", "lc-compl"}, []string{f.ns}, ":4"},
		{[]string{"status", "--driver", f.driver[:5]}, []string{f.driver}, ":4"},
		{[]string{"status", "-o", ""}, []string{"table", "wide", "json", "yaml"}, ":4"},
		{[]string{"explain", "--output="}, []string{"--output=text", "--output=json", "--output=yaml"}, ":4"},
		{[]string{"status", "--sort-by", "n"}, []string{"node", "name"}, ":4"},
		{[]string{"status", "--fail"}, []string{"--fail-pending-older"}, ":4"},
		{[]string{"status", "--fail-pending-older", ""}, nil, ":4"},
		{[]string{"completion", ""}, []string{"bash", "zsh", "fish"}, ":4"},
		{[]string{"version", ""}, nil, ":4"},
		{[]string{"--kubeconfig", ""}, nil, ":0"},
		{[]string{"--context", ""}, []string{"latch-local"}, ":4"},
	} {
		got, directive := completeAs(t, "/usr/local/bin/kubectl_complete-latch", tc.words...)
		if !slices.Equal(got, tc.want) || directive != tc.directive {
			t.Errorf("kubectl_complete-latch %q = %q %s, want %q %s", tc.words, got, directive, tc.want, tc.directive)
		}
		if got2, directive2 := completeAs(t, "latchctl", append([]string{completeCommand}, tc.words...)...); !slices.Equal(got2, got) || directive2 != directive {
			t.Errorf("latchctl __complete %q = %q %s, kubectl_complete-latch %q %s", tc.words, got2, directive2, got, directive)
		}
	}

	// Commands and flags carry their help as the description.
	var out bytes.Buffer
	run(t.Context(), "kubectl_complete-latch", []string{"status", "--dri"}, &out, &bytes.Buffer{}, time.Now)
	if want := "--driver\tstatus: only VolumeAttachments of this CSI driver\n:4\n"; out.String() != want {
		t.Errorf("kubectl_complete-latch status --dri printed %q, want %q", out.String(), want)
	}

	// An API server that cannot be reached completes no names, quickly,
	// and still answers the protocol.
	t.Setenv("KUBECONFIG", "")
	start := time.Now()
	got, directive := completeAs(t, "kubectl_complete-latch", "--kubeconfig=/nonexistent", "explain", "pod", "")
	if len(got) != 0 || directive != ":4" || time.Since(start) > completionTimeout+time.Second {
		t.Errorf("without a cluster: %q %s after %s, want nothing, :4, within %s", got, directive, time.Since(start), completionTimeout)
	}
}
