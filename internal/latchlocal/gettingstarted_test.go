package latchlocal

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/latchcsi/latch/internal/testsupport"
)

// docBlock returns the fenced block of docs/getting-started.md that
// follows the first line containing after, as lines.
func docBlock(t *testing.T, after string) []string {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "getting-started.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := bytes.Cut(doc, []byte(after))
	if !ok {
		t.Fatalf("docs/getting-started.md has no %q", after)
	}
	// The command's own block ends; the output block follows.
	_, rest, _ = bytes.Cut(rest, []byte("```\n"))
	_, rest, _ = bytes.Cut(rest, []byte("```\n"))
	block, _, ok := bytes.Cut(rest, []byte("```"))
	if !ok {
		t.Fatalf("docs/getting-started.md: no output block after %q", after)
	}
	return strings.Split(strings.TrimRight(string(block), "\n"), "\n")
}

// ago normalises the ages latchctl prints.
var ago = regexp.MustCompile(`\d+(ms|s|m|h) ago`)

// shownIn reports whether the doc's line (wrapped, elided with "..." or
// "…") is a part of out: each piece between elisions appears, in order,
// in the output joined into one line.
func shownIn(line, out string) bool {
	pieces := regexp.MustCompile(`\.\.\.|…`).Split(ago.ReplaceAllString(line, "N ago"), -1)
	at := 0
	for _, p := range pieces {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		i := strings.Index(out[at:], p)
		if i < 0 {
			return false
		}
		at += i + len(p)
	}
	return true
}

// getting-started step 4 as a new operator runs it on latch-local: the
// output shown in the doc is what `latchctl explain pod default/app-2`
// prints (ages and elided parts aside), summary line included.
func TestGettingStartedStep4_explainOutputIsTheDocs(t *testing.T) {
	ctx, env := startEnv(t, 3*time.Minute, Options{Nodes: 2})
	applyExamples(t, ctx, env)
	testsupport.Eventually(t, ctx, time.Minute, "example-volume attached to node-1", func(ctx context.Context) (bool, error) {
		vas, err := env.Client.StorageV1().VolumeAttachments().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, va := range vas.Items {
			if va.Spec.NodeName == "node-1" && va.Status.Attached {
				return true, nil
			}
		}
		return false, nil
	})
	// sed 's/app-1/app-2/; s/node-1/node-2/' examples/pod.yaml
	pod, err := os.ReadFile(filepath.Join("..", "..", "examples", "pod.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(string(pod), "\n") {
		lines = append(lines, strings.Replace(strings.Replace(l, "app-1", "app-2", 1), "node-1", "node-2", 1))
	}
	applyManifest(t, ctx, env, "pod.yaml (app-2)", []byte(strings.Join(lines, "\n")))
	testsupport.Eventually(t, ctx, time.Minute, "the Multi-Attach event on app-2", func(ctx context.Context) (bool, error) {
		evs, err := env.Client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=app-2,reason=FailedAttachVolume"})
		return err == nil && len(evs.Items) > 0, err
	})

	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := env.Cluster.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, testsupport.MustBinary(t, "cmd/latchctl"), "explain", "pod", "default/app-2", "--kubeconfig="+kubeconfig)
	var stdout bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, os.Stderr
	err = cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Errorf("latchctl explain: %v, want exit code 1 (a problem was found, as the doc says)", err)
	}
	checkExplainShown(t, docBlock(t, "kubectl latch explain pod default/app-2\n"), stdout.String())
}
