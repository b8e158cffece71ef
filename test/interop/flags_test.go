package interop

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/latchcsi/latch/internal/testsupport"
)

// The image swap keeps the args: every flag the real upstream
// external-attacher accepts, in every value form it accepts, must be
// accepted by latch's csi-attacher. The lists come from the upstream
// binary's own --help, so a flag or feature gate a future upstream adds
// fails this test until latch accepts it too.

// upstreamFlag is one flag of a Go flag package --help.
type upstreamFlag struct {
	name     string
	typ      string // "" for a bool flag; the back-quoted example when the help has one
	def      string // the "(default ...)" value, unquoted; "" when none is shown
	hasDef   bool
	usage    string
	examples []string // values from "Example: '...'"
}

var (
	flagLine    = regexp.MustCompile(`^  -([a-zA-Z0-9-]+)(?: (\S+))?$`)
	defaultPart = regexp.MustCompile(`\(default (.*)\)$`)
	examplePart = regexp.MustCompile(`Example: '([^']+)'`)
	gateLine    = regexp.MustCompile(`^\s+([A-Za-z0-9]+)=true\|false \((ALPHA|BETA|GA|DEPRECATED) - default=(true|false)\)$`)
)

// parseFlagHelp reads the flags and the feature gates (the lines of
// --feature-gates' usage) of a Go flag package's PrintDefaults output.
func parseFlagHelp(help string) (flags []upstreamFlag, gates map[string]string) {
	gates = map[string]string{}
	var cur *upstreamFlag
	for _, line := range strings.Split(help, "\n") {
		if m := flagLine.FindStringSubmatch(line); m != nil {
			flags = append(flags, upstreamFlag{name: m[1], typ: m[2]})
			cur = &flags[len(flags)-1]
			continue
		}
		if m := gateLine.FindStringSubmatch(line); m != nil && cur != nil && cur.name == "feature-gates" {
			gates[m[1]] = m[3]
			continue
		}
		if cur == nil || !strings.HasPrefix(line, "    \t") {
			continue
		}
		text := strings.TrimPrefix(line, "    \t")
		cur.usage += text + " "
		if m := defaultPart.FindStringSubmatch(text); m != nil {
			cur.def, cur.hasDef = strings.Trim(m[1], `"`), true
		}
		for _, m := range examplePart.FindAllStringSubmatch(text, -1) {
			cur.examples = append(cur.examples, m[1])
		}
	}
	return flags, gates
}

// valueOnlyFlags are the flags of type "value" (flag.Value) whose --help
// shows neither a default nor an example: the value used is the zero value
// the usage text describes. A new such flag has no entry and fails the
// test, so that someone picks a representative value for it.
var valueOnlyFlags = map[string]string{
	"v":                         "2",
	"vmodule":                   "",
	"log-json-info-buffer-size": "0",
	"log-text-info-buffer-size": "0",
}

// representativeValues are the values tried for f: upstream's default,
// the documented example, the back-quoted example of the usage text, or
// the zero value of its type.
func representativeValues(f upstreamFlag) ([]string, error) {
	var vals []string
	if f.hasDef {
		vals = append(vals, f.def)
	}
	vals = append(vals, f.examples...)
	switch {
	case f.typ == "":
		vals = append(vals, "true", "false")
	case strings.HasPrefix(f.typ, ":") || strings.HasPrefix(f.typ, "/"):
		vals = append(vals, f.typ) // a back-quoted example, e.g. :8080
	case f.typ == "string" && !f.hasDef:
		vals = append(vals, "")
	case (f.typ == "int" || f.typ == "uint" || f.typ == "float") && !f.hasDef:
		vals = append(vals, "0")
	case f.typ == "duration" && !f.hasDef:
		vals = append(vals, "0s")
	case f.typ == "value" && !f.hasDef && len(f.examples) == 0:
		v, ok := valueOnlyFlags[f.name]
		if !ok {
			return nil, fmt.Errorf("--%s takes a value with no default or example in upstream's --help; add a representative value to valueOnlyFlags", f.name)
		}
		vals = append(vals, v)
	}
	if len(vals) == 0 {
		return nil, fmt.Errorf("--%s (%s): no representative value in upstream's --help %q", f.name, f.typ, f.usage)
	}
	return vals, nil
}

// exitCode runs bin with args (and --version, so that a binary stops after
// parsing its flags) and returns its exit code and output.
func exitCode(t *testing.T, bin string, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append(args, "--version")...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%s %v did not stop after --version: %s", bin, args, out.String())
	}
	if err != nil && cmd.ProcessState == nil {
		t.Fatalf("run %s: %v", bin, err)
	}
	return cmd.ProcessState.ExitCode(), out.String()
}

func upstreamHelp(t *testing.T, bin string) string {
	t.Helper()
	out, _ := exec.Command(bin, "--help").CombinedOutput() // exits 0 or 2 depending on the flag package's mode
	if !strings.Contains(string(out), "-csi-address") {
		t.Fatalf("upstream --help does not list --csi-address:\n%s", out)
	}
	return string(out)
}

// acceptsLikeUpstream runs both binaries with args and fails when upstream
// accepts them and ours does not. It reports whether upstream accepted.
func acceptsLikeUpstream(t *testing.T, upstream, ours string, args ...string) bool {
	t.Helper()
	if code, out := exitCode(t, upstream, args...); code != 0 {
		t.Logf("upstream refuses %v (exit %d), so ours need not accept it: %s", args, code, firstLine(out))
		return false
	}
	if code, out := exitCode(t, ours, args...); code != 0 {
		t.Errorf("csi-attacher refuses %v, which upstream accepts: exit %d: %s", args, code, out)
	}
	return true
}

// acceptAllLikeUpstream is acceptsLikeUpstream for each of argSets, which
// upstream must all accept: forms drivers' manifests pass.
func acceptAllLikeUpstream(t *testing.T, upstream, ours string, argSets ...[]string) {
	t.Helper()
	for _, args := range argSets {
		if !acceptsLikeUpstream(t, upstream, ours, args...) {
			t.Errorf("upstream refuses %v", args)
		}
	}
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return line
}

func TestCSIAttacher_acceptsEveryFlagOfUpstreamExternalAttacher(t *testing.T) {
	upstream := testsupport.MustUpstreamBinary(t, "external-attacher")
	ours := testsupport.MustBinary(t, "cmd/csi-attacher")
	flags, _ := parseFlagHelp(upstreamHelp(t, upstream))
	// A parser that finds nothing would pass vacuously: upstream v4.13.0
	// has 30 flags, and these are the ones drivers' manifests pass.
	names := map[string]bool{}
	for _, f := range flags {
		names[f.name] = true
	}
	for _, must := range []string{"csi-address", "timeout", "leader-election", "leader-election-labels", "feature-gates", "http-endpoint", "worker-threads", "v"} {
		if !names[must] {
			t.Fatalf("parsed %d flags from upstream's --help, --%s not among them: %v", len(flags), must, names)
		}
	}
	for _, f := range flags {
		if f.name == "feature-gates" || f.name == "version" {
			continue // the gates have a test of their own; --version is passed to every run
		}
		vals, err := representativeValues(f)
		if err != nil {
			t.Error(err)
			continue
		}
		accepted := 0
		for _, v := range vals {
			if acceptsLikeUpstream(t, upstream, ours, "--"+f.name+"="+v) {
				accepted++
			}
		}
		if accepted == 0 {
			t.Errorf("--%s: upstream refuses every representative value %q: pick one it accepts", f.name, vals)
		}
	}
}

// gatesUpstreamDoesNotList are gates upstream accepts but --help does not
// list (featuregate lists neither GA nor deprecated gates).
// MutableCSINodeAllocatableCount is GA in external-attacher v4.13.0.
var gatesUpstreamDoesNotList = []string{"MutableCSINodeAllocatableCount"}

func TestCSIAttacher_acceptsEveryFeatureGateOfUpstreamExternalAttacher(t *testing.T) {
	upstream := testsupport.MustUpstreamBinary(t, "external-attacher")
	ours := testsupport.MustBinary(t, "cmd/csi-attacher")
	_, gates := parseFlagHelp(upstreamHelp(t, upstream))
	if _, ok := gates["ReleaseLeaderElectionOnExit"]; !ok || len(gates) < 10 {
		t.Fatalf("parsed %d feature gates from upstream's --help, want ReleaseLeaderElectionOnExit among 10 or more: %v", len(gates), gates)
	}
	names := append([]string(nil), gatesUpstreamDoesNotList...)
	for g := range gates {
		names = append(names, g)
	}
	for _, g := range names {
		accepted := 0
		for _, v := range []string{"true", "false"} {
			if acceptsLikeUpstream(t, upstream, ours, "--feature-gates="+g+"="+v) {
				accepted++
			}
		}
		if accepted == 0 {
			t.Errorf("upstream refuses --feature-gates=%s with both values", g)
		}
	}
	// The forms drivers' manifests pass: several gates in one flag, and the
	// flag repeated.
	acceptAllLikeUpstream(t, upstream, ours,
		[]string{"--feature-gates=ReleaseLeaderElectionOnExit=true,MutableCSINodeAllocatableCount=true"},
		[]string{"--feature-gates=ReleaseLeaderElectionOnExit=true", "--feature-gates=MutableCSINodeAllocatableCount=true"},
	)
}

func TestCSIAttacher_acceptsUpstreamsLeaderElectionLabelForms(t *testing.T) {
	upstream := testsupport.MustUpstreamBinary(t, "external-attacher")
	ours := testsupport.MustBinary(t, "cmd/csi-attacher")
	acceptAllLikeUpstream(t, upstream, ours,
		[]string{"--leader-election-labels=app:foo"},
		[]string{"--leader-election-labels=app:foo,b:c"},
		[]string{"--leader-election-labels=example.com/owner:team-a"},
		[]string{"--leader-election-labels=app:foo", "--leader-election-labels=b:c"},
	)
}

// Past the flags: with upstream's common flags, gates and labels the
// binary starts (it stops where it needs the API server, exit 1, not at
// its flags, exit 2), and logs once each gate that has no effect in latch.
func TestCSIAttacher_startsWithUpstreamsFlagsAndLogsGatesWithoutEffectOnce(t *testing.T) {
	ours := testsupport.MustBinary(t, "cmd/csi-attacher")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, ours,
		"--v=5", "--csi-address=/run/csi/socket", "--timeout=60s", "--worker-threads=10",
		"--leader-election", "--leader-election-namespace=kube-system", "--leader-election-labels=app:foo,b:c",
		"--http-endpoint=:0", "--kube-api-qps=5", "--kube-api-burst=10",
		"--feature-gates=ReleaseLeaderElectionOnExit=true,MutableCSINodeAllocatableCount=false,WatchList=false",
		"--kubeconfig="+t.TempDir()+"/missing")
	out, err := cmd.CombinedOutput()
	if code := cmd.ProcessState.ExitCode(); code != 1 {
		t.Fatalf("exit %d (%v), want 1 (no API server); output:\n%s", code, err, out)
	}
	for gate, want := range map[string]int{"MutableCSINodeAllocatableCount": 1, "WatchList": 1, "ReleaseLeaderElectionOnExit": 0} {
		if got := strings.Count(string(out), `"Feature gate has no effect in latch" gate="`+gate+`"`); got != want {
			t.Errorf("gate %s logged as without effect %d times, want %d; output:\n%s", gate, got, want, out)
		}
	}
}

// documentedDefaultDifferences reads docs/migration.md's "Differences in
// defaults" table: flag name → the upstream and latch defaults it gives.
func documentedDefaultDifferences(t *testing.T) map[string][2]string {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "migration.md")) // tests run in their package directory
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(doc), "Differences in defaults:")
	if !ok {
		t.Fatal(`docs/migration.md has no "Differences in defaults:" table`)
	}
	row := regexp.MustCompile("^\\| `--([a-z0-9-]+)` \\| ([^|]+) \\| ([^|]+) \\|")
	out := map[string][2]string{}
	for _, line := range strings.Split(table, "\n") {
		if m := row.FindStringSubmatch(line); m != nil {
			out[m[1]] = [2]string{strings.TrimSpace(m[2]), strings.TrimSpace(m[3])}
		} else if len(out) > 0 && !strings.HasPrefix(line, "|") {
			break
		}
	}
	if len(out) < 3 {
		t.Fatalf("read %d rows from docs/migration.md's defaults table, want the qps, burst and worker-threads rows at least: %v", len(out), out)
	}
	return out
}

// Drop-in means upstream's defaults too: every flag upstream's --help
// shows a default for has the same default in latch's --help, unless
// docs/migration.md's table lists it with both values; and every gate of
// upstream's --feature-gates has latch's stage and default.
func TestCSIAttacher_defaultsAndGatesAreUpstreamsExceptWhereMigrationDocSaysSo(t *testing.T) {
	upstream := testsupport.MustUpstreamBinary(t, "external-attacher")
	ours := testsupport.MustBinary(t, "cmd/csi-attacher")
	upFlags, upGates := parseFlagHelp(upstreamHelp(t, upstream))
	ourFlags, ourGates := parseFlagHelp(upstreamHelp(t, ours))
	documented := documentedDefaultDifferences(t)

	byName := map[string]upstreamFlag{}
	for _, f := range ourFlags {
		byName[f.name] = f
	}
	compared := 0
	for _, up := range upFlags {
		f, ok := byName[up.name]
		if !ok {
			t.Errorf("--%s: upstream has it, latch's --help does not list it", up.name)
			continue
		}
		if doc, ok := documented[up.name]; ok {
			// The doc's values lead with the number: "10 (one queue)".
			if first(doc[0]) != up.def || first(doc[1]) != f.def {
				t.Errorf("--%s: docs/migration.md says upstream %q, latch %q; the binaries say upstream %q, latch %q", up.name, doc[0], doc[1], up.def, f.def)
			}
			continue
		}
		if up.hasDef != f.hasDef || up.def != f.def {
			t.Errorf("--%s: default %q in latch, %q upstream, and docs/migration.md does not list the difference", up.name, f.def, up.def)
		}
		compared++
	}
	if compared < 10 {
		t.Fatalf("compared %d defaults, want upstream's 30-odd flags", compared)
	}
	for name := range documented {
		if _, ok := byName[name]; !ok {
			t.Errorf("docs/migration.md lists --%s, which latch's --help does not", name)
		}
	}

	if len(upGates) < 10 {
		t.Fatalf("parsed %d gates from upstream's --help", len(upGates))
	}
	for gate, def := range upGates {
		got, ok := ourGates[gate]
		if !ok {
			t.Errorf("gate %s: upstream lists it (default %s), latch's --help does not", gate, def)
		} else if got != def {
			t.Errorf("gate %s: default %s in latch, %s upstream", gate, got, def)
		}
	}
	upStages, ourStages := gateStages(upstreamHelp(t, upstream)), gateStages(upstreamHelp(t, ours))
	for gate, stage := range upStages {
		if ourStages[gate] != stage {
			t.Errorf("gate %s: stage %q in latch, %q upstream", gate, ourStages[gate], stage)
		}
	}
}

// first is the first word of s.
func first(s string) string {
	w, _, _ := strings.Cut(s, " ")
	return w
}

// gateStages maps each gate of a --help's --feature-gates usage to its
// stage (ALPHA, BETA...).
func gateStages(help string) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(help, "\n") {
		if m := gateLine.FindStringSubmatch(line); m != nil {
			out[m[1]] = m[2]
		}
	}
	return out
}
