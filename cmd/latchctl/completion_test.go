package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// completionScript runs `latchctl completion <shell>` and returns the script.
func completionScript(t *testing.T, shell string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	if code := run(t.Context(), "latchctl", []string{"completion", shell}, &out, &errOut, time.Now); code != exitHealthy {
		t.Fatalf("completion %s: exit %d: %s", shell, code, errOut.String())
	}
	return out.String()
}

// fakeKubectl puts a kubectl on PATH that records its arguments and
// answers every list with two names; it returns the PATH and the record.
func fakeKubectl(t *testing.T) (path, record string) {
	t.Helper()
	dir := t.TempDir()
	record = filepath.Join(dir, "args")
	script := "#!/bin/sh\necho \"$*\" >> " + record + "\necho web-0 web-1\n"
	if err := os.WriteFile(filepath.Join(dir, "kubectl"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir + ":/usr/bin:/bin", record
}

// bashComplete loads the bash script and completes words (the last one is
// the word under the cursor), as bash does on TAB.
func bashComplete(t *testing.T, script, path string, words ...string) []string {
	t.Helper()
	var quoted []string
	for _, w := range words {
		quoted = append(quoted, "'"+w+"'")
	}
	prog := script + "\nCOMP_WORDS=(" + strings.Join(quoted, " ") + ")\nCOMP_CWORD=" + strconv.Itoa(len(words)-1) +
		"\n_latchctl\nprintf '%s\\n' \"${COMPREPLY[@]}\"\n"
	cmd := exec.Command("bash", "--norc", "--noprofile", "-c", prog)
	cmd.Env = []string{"PATH=" + path, "HOME=" + t.TempDir()}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("bash completion of %q: %v\n%s", words, err, out)
	}
	return strings.Fields(string(out))
}

// `latchctl completion bash` is valid bash that completes the commands,
// explain's kinds, the objects of a kind (through kubectl, with the
// command line's --context and -n), the flags and their values per
// command; zsh's and fish's name the same commands and flags.
func TestCompletionScripts(t *testing.T) {
	bash := completionScript(t, "bash")
	syntax := exec.Command("bash", "-n")
	syntax.Stdin = strings.NewReader(bash)
	if out, err := syntax.CombinedOutput(); err != nil {
		t.Fatalf("bash -n rejects the script: %v\n%s", err, out)
	}
	path, record := fakeKubectl(t)
	for _, tc := range []struct {
		words []string
		want  []string
	}{
		{[]string{"latchctl", ""}, []string{"completion", "explain", "help", "status", "version"}},
		{[]string{"latchctl", "st"}, []string{"status"}},
		{[]string{"latchctl", "explain", ""}, []string{"pod", "pv", "pvc", "va"}},
		{[]string{"latchctl", "-n", "app", "explain", "p"}, []string{"pod", "pv", "pvc"}},
		{[]string{"latchctl", "--context", "c1", "explain", "pod", "-n", "app", "w"}, []string{"web-0", "web-1"}},
		{[]string{"latchctl", "status", "--sort-by", ""}, []string{"age", "driver", "name", "node"}},
		{[]string{"latchctl", "status", "-o", ""}, []string{"json", "table", "wide", "yaml"}},
		{[]string{"latchctl", "explain", "-o", ""}, []string{"json", "text", "yaml"}},
		{[]string{"latchctl", "completion", ""}, []string{"bash", "fish", "zsh"}},
		{[]string{"latchctl", "status", "--fail"}, []string{"--fail-pending-older"}},
		{[]string{"latchctl", "status", "--fail-pending-older", ""}, nil},
		{[]string{"latchctl", "version", ""}, nil},
	} {
		got := bashComplete(t, bash, path, tc.words...)
		slices.Sort(got)
		if !slices.Equal(got, tc.want) {
			t.Errorf("bash: %q<TAB> completes to %q, want %q", strings.Join(tc.words, " "), got, tc.want)
		}
	}
	if args, err := os.ReadFile(record); err != nil || !strings.Contains(string(args), "--context c1 -n app get pods") {
		t.Errorf("kubectl was called with %q (%v), want the command line's --context and -n and `get pods`", args, err)
	}
	// Without kubectl the names complete to nothing, without an error.
	if got := bashComplete(t, bash, "/usr/bin:/bin", "latchctl", "explain", "va", ""); slices.Contains(got, "web-0") {
		t.Errorf("without kubectl: %q", got)
	}

	// zsh's and fish's scripts name every command, kind and flag; where
	// those shells are installed, they parse the script, and fish
	// completes from it.
	for _, shell := range completionShells {
		script := completionScript(t, shell)
		for _, c := range commands() {
			if !strings.Contains(script, c.Name) {
				t.Errorf("%s script does not name the command %s", shell, c.Name)
			}
		}
		for _, k := range primaryKinds() {
			if !strings.Contains(script, k) {
				t.Errorf("%s script does not name the kind %s", shell, k)
			}
		}
		newFlagSet(&Config{}).VisitAll(func(f *pflag.Flag) {
			spelled := "--" + f.Name
			if shell == "fish" {
				spelled = "-l " + f.Name
			}
			if !strings.Contains(script, spelled) {
				t.Errorf("%s script does not name the flag --%s", shell, f.Name)
			}
		})
		if _, err := exec.LookPath(shell); err != nil || shell == "bash" {
			continue
		}
		check := exec.Command(shell, "-n")
		check.Stdin = strings.NewReader(script)
		if out, err := check.CombinedOutput(); err != nil {
			t.Errorf("%s -n rejects the script: %v\n%s", shell, err, out)
		}
		if shell == "fish" {
			f := filepath.Join(t.TempDir(), "latchctl.fish")
			if err := os.WriteFile(f, []byte(script), 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command("fish", "--no-config", "-c", "source "+f+"; complete -C 'latchctl explain '; complete -C 'latchctl status -o '")
			cmd.Env = []string{"PATH=" + path, "HOME=" + t.TempDir()}
			out, err := cmd.CombinedOutput()
			var got []string
			for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
				got = append(got, strings.SplitN(l, "\t", 2)[0])
			}
			if want := []string{"pod", "pv", "pvc", "va", "json", "table", "wide", "yaml"}; err != nil || !slices.Equal(got, want) {
				t.Errorf("fish completes to %q (%v), want %q", got, err, want)
			}
		}
	}
	var out, errOut bytes.Buffer
	if code := run(t.Context(), "latchctl", []string{"completion", "tcsh"}, &out, &errOut, time.Now); code != exitError {
		t.Errorf("completion tcsh: exit %d, want %d", code, exitError)
	}
}
