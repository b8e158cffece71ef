package deploy_test

import (
	"bufio"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/latchcsi/latch/internal/testsupport"
)

// The README's first-run section shows, after make demo's progress lines,
// the line latch-local prints when it builds kube-controller-manager (with
// kube-scheduler and the hollow kubelet, in one go build). The
// test runs `latch-local demo` (the binary make demo runs) and stops it
// once that line is printed: the line must be the README's, word for word.
func TestREADMEShowsTheKubeControllerManagerBuildLineLatchLocalPrints(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join(repoRoot(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	const prefix = "hollow-kubelet+kube-controller-manager+kube-scheduler: building "
	var shown string
	for _, l := range strings.Split(string(readme), "\n") {
		if strings.HasPrefix(l, prefix) {
			shown = l
		}
	}
	if shown == "" {
		t.Fatalf("README.md shows no line starting %q", prefix)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, testsupport.MustBinary(t, "cmd/latch-local"), "demo", "--log-file", filepath.Join(t.TempDir(), "latch-local.log"))
	cmd.Dir = repoRoot(t) // as make demo runs it
	// Stopped as Ctrl-C stops it, so that it cleans up.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = time.Minute
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var printed, before []string
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), prefix) {
			printed = append(printed, sc.Text())
			break
		}
		before = append(before, sc.Text())
	}
	// Ctrl-C: the demo stops where it is.
	drained := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, stderr); close(drained) }()
	_ = cmd.Process.Signal(os.Interrupt)
	select {
	case <-drained:
	case <-time.After(time.Minute):
	}
	_ = cmd.Wait()
	if len(printed) == 0 {
		t.Fatalf("latch-local demo printed no line starting %q; its standard error:\n%s", prefix, strings.Join(before, "\n"))
	}
	if printed[0] != shown {
		t.Errorf("latch-local prints\n  %s\nREADME.md shows\n  %s", printed[0], shown)
	}
}
