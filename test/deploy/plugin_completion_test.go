package deploy_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/localcluster"
)

// makeBuildInstalls returns the files `make build` copies latchctl to,
// from the recipe make would run (make -n).
func makeBuildInstalls(t *testing.T) []string {
	t.Helper()
	cmd := exec.Command("make", "-n", "build", "BIN_DIR=BIN")
	cmd.Dir = repoRoot(t)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make -n build: %v\n%s", err, out)
	}
	var copies []string
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "cp" && f[1] == "BIN/latchctl" {
			copies = append(copies, strings.TrimPrefix(f[2], "BIN/"))
		}
	}
	return copies
}

// `kubectl latch <TAB>`: make build installs bin/kubectl-latch and
// bin/kubectl_complete-latch (copies of latchctl); with both on PATH,
// kubectl's own shell completion (`kubectl __complete latch …`, what
// kubectl's completion scripts run; kubectl's command from k8s.io/kubectl,
// as TestLatchctlRunsAsKubectlPlugin uses it) completes the plugin's
// commands, explain's kinds and the Pods of a namespace from the cluster
// of KUBECONFIG, and flag values; without the completer it offers nothing
// past the plugin's name.
func TestKubectlCompletesTheLatchPluginThroughItsCompleter(t *testing.T) {
	installs := makeBuildInstalls(t)
	for _, want := range []string{"kubectl-latch", "kubectl_complete-latch"} {
		if !slices.Contains(installs, want) {
			t.Errorf("make build copies latchctl to %q, not to %s", installs, want)
		}
	}
	raw, err := os.ReadFile(filepath.Join(binaries(t), "latchctl"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, name := range installs {
		if err := os.WriteFile(filepath.Join(dir, name), raw, 0o755); err != nil {
			t.Fatal(err)
		}
	}

	// The minute is the test's own: it starts once the binaries are built
	// (a cold build cache takes minutes).
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	// A namespace of this run's (the package shares one API server, and
	// -count=2 runs the test twice on it).
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	ns := "plugin-completion-" + hex.EncodeToString(suffix)
	client := cluster.Client()
	if err := localcluster.CreateNamespace(ctx, client, ns); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"web-0", "web-1"} {
		pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: v1.PodSpec{Containers: []v1.Container{{Name: "app", Image: "registry.invalid/app"}}}}
		if _, err := client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := cluster.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	// kubectl completes a word by running its hidden __complete command:
	// one completion per line, then ":<directive>".
	kubectlComplete := func(path string, words ...string) ([]string, string) {
		t.Helper()
		cmd := exec.CommandContext(ctx, os.Args[0], append([]string{"__complete"}, words...)...)
		cmd.Env = append(os.Environ(), runAsKubectl+"=1", "KUBECONFIG="+kubeconfig, "PATH="+path)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("kubectl __complete %q: %v\n%s", words, err, out)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		var comps []string
		for _, l := range lines[:len(lines)-1] {
			comps = append(comps, strings.SplitN(l, "\t", 2)[0])
		}
		return comps, lines[len(lines)-1]
	}
	path := dir + string(os.PathListSeparator) + os.Getenv("PATH")
	for _, tc := range []struct {
		words     []string
		want      []string
		directive string
	}{
		{[]string{"lat"}, []string{"latch"}, ""},
		{[]string{"latch", ""}, []string{"explain", "status", "completion", "version", "help"}, ":4"},
		{[]string{"latch", "explain", ""}, []string{"pod", "pvc", "pv", "va"}, ":4"},
		{[]string{"latch", "explain", "pod", "-n", ns, ""}, []string{"web-0", "web-1"}, ":4"},
		{[]string{"latch", "-n", ns, "explain", "pod", "web-1"}, []string{"web-1"}, ":4"},
		{[]string{"latch", "status", "-o", ""}, []string{"table", "wide", "json", "yaml"}, ":4"},
		{[]string{"latch", "status", "--sort"}, []string{"--sort-by"}, ":4"},
	} {
		got, directive := kubectlComplete(path, tc.words...)
		if tc.directive == "" {
			// kubectl's own words: only that the plugin is among them.
			if !slices.Contains(got, "latch") {
				t.Errorf("kubectl __complete %q = %q, want the plugin latch among them", tc.words, got)
			}
			continue
		}
		if !slices.Equal(got, tc.want) || directive != tc.directive {
			t.Errorf("kubectl __complete %q = %q %s, want %q %s", tc.words, got, directive, tc.want, tc.directive)
		}
	}

	// Without the completer kubectl completes nothing past the plugin.
	noCompleter := t.TempDir()
	if err := os.WriteFile(filepath.Join(noCompleter, "kubectl-latch"), raw, 0o755); err != nil {
		t.Fatal(err)
	}
	if got, _ := kubectlComplete(noCompleter+string(os.PathListSeparator)+os.Getenv("PATH"), "latch", "explain", ""); len(got) != 0 {
		t.Errorf("kubectl-latch alone completes %q: the test does not exercise the completer", got)
	}
}
