package latchlocal

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/latchcsi/latch/internal/testsupport"
)

// The docs' shell blocks run as an operator runs them: in bash, in a
// directory that looks like the repository root after `make build` (bin/
// with latch-local, kubectl-latch, and kubectl; examples/ and deploy/),
// with the exports the docs make carried from one command to the next.
// kubectl is this test binary running kubectl's own command
// (k8s.io/kubectl, as test/deploy runs it): no kubectl needs to be
// installed.

// runAsKubectl makes the test binary run kubectl's command instead of the
// tests (main_test.go).
const runAsKubectl = "LATCH_TEST_RUN_KUBECTL"

// docStep is one ```sh block of a doc: its commands (continuation lines
// joined, blank lines dropped) and the output block shown right after it
// (nil when none is).
type docStep struct {
	commands []string
	output   []string
}

// docShellSteps returns the ```sh blocks of the part of the doc file
// (relative to the repository root) that starts with the line from and
// ends before the next line starting with "## ".
func docShellSteps(t *testing.T, file, from string) []docStep {
	t.Helper()
	data, err := testsupport.RepoFile(file)
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "\n"+from+"\n")
	if !ok {
		t.Fatalf("%s has no line %q", file, from)
	}
	if i := strings.Index(section, "\n## "); i >= 0 {
		section = section[:i]
	}
	lines := strings.Split(section, "\n")
	var steps []docStep
	for i := 0; i < len(lines); i++ {
		if strings.TrimSpace(lines[i]) != "```sh" {
			continue
		}
		var s docStep
		var cont string
		for i++; i < len(lines) && strings.TrimSpace(lines[i]) != "```"; i++ {
			l := strings.TrimSpace(lines[i])
			if l == "" {
				continue
			}
			if c, ok := strings.CutSuffix(l, "\\"); ok {
				cont += c
				continue
			}
			s.commands = append(s.commands, cont+l)
			cont = ""
		}
		// The output block, if one follows with only blank lines between.
		j := i + 1
		for j < len(lines) && strings.TrimSpace(lines[j]) == "" {
			j++
		}
		if j < len(lines) && lines[j] == "```" {
			s.output = []string{}
			for j++; j < len(lines) && lines[j] != "```"; j++ {
				s.output = append(s.output, lines[j])
			}
			i = j
		}
		steps = append(steps, s)
	}
	return steps
}

// shell runs doc commands in an operator's working directory.
type shell struct {
	t       *testing.T
	ctx     context.Context
	dir     string
	env     []string
	exports []string
}

// newShell prepares the working directory: bin/ with kubectl (this test
// binary), kubectl-latch (latchctl, as make build installs it) and
// latch-local, and examples/ and deploy/ of the repository.
func newShell(t *testing.T, ctx context.Context) *shell {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	links := map[string]string{
		filepath.Join(bin, "kubectl"):       self,
		filepath.Join(bin, "kubectl-latch"): testsupport.MustBinary(t, "cmd/latchctl"),
		filepath.Join(bin, "latch-local"):   testsupport.MustBinary(t, "cmd/latch-local"),
	}
	for _, d := range []string{"examples", "deploy"} {
		abs, err := filepath.Abs(filepath.Join("..", "..", d))
		if err != nil {
			t.Fatal(err)
		}
		links[filepath.Join(dir, d)] = abs
	}
	for link, target := range links {
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
	}
	home := filepath.Join(dir, ".home") // kubectl's caches
	if err := os.Mkdir(home, 0o700); err != nil {
		t.Fatal(err)
	}
	var env []string
	for _, kv := range os.Environ() {
		switch k, _, _ := strings.Cut(kv, "="); k {
		case "KUBECONFIG", "PWD", "HOME", runAsKubectl:
		default:
			env = append(env, kv)
		}
	}
	env = append(env, "PWD="+dir, "HOME="+home, runAsKubectl+"=1")
	return &shell{t: t, ctx: ctx, dir: dir, env: env}
}

// run runs one command line in bash (pipefail), after the exports the
// doc made before it, and returns its standard output; a failure (exit
// status other than 0) ends the test.
func (s *shell) run(command string) string {
	s.t.Helper()
	out, errOut, err := s.try(command)
	if err != nil {
		s.t.Fatalf("`%s`: %v\nstdout:\n%s\nstderr:\n%s", command, err, out, errOut)
	}
	if strings.HasPrefix(command, "export ") {
		s.exports = append(s.exports, command)
	}
	return out
}

// try runs command as run does and returns what it printed and its
// error.
func (s *shell) try(command string) (stdout, stderr string, err error) {
	script := "set -eo pipefail\n" + strings.Join(s.exports, "\n") + "\n" + command + "\n"
	cmd := exec.CommandContext(s.ctx, "bash", "-c", script)
	cmd.Dir, cmd.Env = s.dir, s.env
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.String(), e.String(), err
}

// checkOutput fails the test unless got (what a block's commands printed)
// is the output block shown, line by line, with runs of spaces counted as
// one.
func checkOutput(t *testing.T, commands, shown []string, got string) {
	t.Helper()
	norm := func(lines []string) string {
		var out []string
		for _, l := range lines {
			if f := strings.Fields(l); len(f) > 0 {
				out = append(out, strings.Join(f, " "))
			}
		}
		return strings.Join(out, "\n")
	}
	if g, w := norm(strings.Split(got, "\n")), norm(shown); g != w {
		t.Errorf("the doc shows for\n  %s\nthis output:\n%s\nthe commands print:\n%s", strings.Join(commands, "\n  "), w, g)
	}
}
