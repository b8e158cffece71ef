package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/latchcsi/latch/internal/testsupport"
)

// A scenario is one existing end-to-end test the matrix runs on every
// minor.
type scenario struct {
	Name    string // short, for -scenarios
	What    string // the table's row title
	Package string
	Test    string
}

// scenarios are the core scenarios of issue 40's matrix, each an existing
// test: attach and detach through a hollow kubelet, multi-attach, the
// out-of-service taint, a controller restart with work in flight, the
// kubelet order check, a kubelet restart, the swap with
// kube-controller-manager of the same version, kube-controller-manager's
// event text beside latch's, and what differs between the minors.
var scenarios = []scenario{
	{"attach-detach", "attach and detach through a hollow kubelet (attachdetach-controller)", "./test/e2e/attachdetach/", "TestPodLifecycle_attachThenDetach"},
	{"kubelet-lifecycle", "attach, mount, unmount, detach in the kubelet's order (csi-attacher, mock driver)", "./test/e2e/kubelet/", "TestKubeletVolumeLifecycle"},
	{"multi-attach", "multi-attach: the second node waits with one event, then attaches", "./test/e2e/attachdetach/", "TestMultiAttach_secondNodeWaitsWithOneEventThenAttaches"},
	{"out-of-service", "out-of-service taint detaches at once", "./test/e2e/attachdetach/", "TestOutOfServiceTaint_detachesAtOnce"},
	{"controller-restart", "controller restart with work in flight", "./test/e2e/attachdetach/", "TestControllerRestart_rebuildsStateAndDetachesDanglingAttachment"},
	{"kubelet-order", "kubelet order check catches a detach of a mounted volume", "./test/e2e/attachdetach/", "TestKubeletOrderCheck_reportsTheDetachOfAMountedVolume"},
	{"kubelet-restart", "kubelet restart reconstructs its volumes", "./test/e2e/kubelet/", "TestKubeletRestartReconstructsVolumes"},
	{"kcm-swap", "swap with kube-controller-manager and back, work in flight", "./test/interop/", "TestSwapAttachDetach_kcmToLatchAndBack"},
	{"apiserver-restart", "the release's kube-apiserver restarted: same address, objects and clients", "./internal/localcluster/", "TestClusterRestartKeepsAddressObjectsAndClients"},
	{"kcm-event-text", "kube-controller-manager and latch record the same attach timeout event", "./test/interop/", "TestNoAttacher_kcmAndLatchRecordTheSameTimeoutEvent"},
	{"version-facts", "what latch relies on, as this version serves it", "./test/e2e/attachdetach/", "TestKubernetesVersion_whatLatchReliesOn"},
}

func scenarioNames() []string {
	names := make([]string, len(scenarios))
	for i, s := range scenarios {
		names[i] = s.Name
	}
	return names
}

// selectScenarios are the scenarios only names (comma-separated), or all.
func selectScenarios(only string) ([]scenario, error) {
	if only == "" {
		return scenarios, nil
	}
	var out []scenario
	for _, name := range strings.Split(only, ",") {
		i := slices.IndexFunc(scenarios, func(s scenario) bool { return s.Name == strings.TrimSpace(name) })
		if i < 0 {
			return nil, fmt.Errorf("no scenario %q (there are: %s)", name, strings.Join(scenarioNames(), ", "))
		}
		out = append(out, scenarios[i])
	}
	return out, nil
}

// packagesOf are the packages of chosen, in order of first appearance.
func packagesOf(chosen []scenario) []string {
	var pkgs []string
	for _, s := range chosen {
		if !slices.Contains(pkgs, s.Package) {
			pkgs = append(pkgs, s.Package)
		}
	}
	return pkgs
}

// result is a test's outcome: "pass", "fail" or "skip", and its time.
type result struct {
	Action  string
	Elapsed time.Duration
}

// column is one minor's run.
type column struct {
	Release  testsupport.KubernetesRelease
	Build    time.Duration
	BuildErr error
	// Says is what the binaries answer to --version.
	Says    string
	Total   time.Duration
	Results map[string]result // by test name
}

// event is one line of go test's JSON (test2json) output.
type event struct {
	Time    time.Time
	Action  string
	Test    string
	Elapsed float64
}

// eventReader collects top-level tests' outcomes from test2json lines.
type eventReader struct {
	progress func(event, result) // called with r's lock held
	mu       sync.Mutex
	got      map[string]result
	// started is when each test ran: a test whose subtests are parallel
	// reports its own time as 0s (it returns before they run), so a
	// test's time is from its run to its outcome.
	started map[string]time.Time
}

func (r *eventReader) line(b []byte) {
	var e event
	if json.Unmarshal(b, &e) != nil || e.Test == "" || strings.Contains(e.Test, "/") {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.got == nil {
		r.got, r.started = map[string]result{}, map[string]time.Time{}
	}
	switch e.Action {
	case "run":
		r.started[e.Test] = e.Time
		return
	case "pass", "fail", "skip":
	default:
		return
	}
	elapsed := time.Duration(e.Elapsed * float64(time.Second))
	if start, ok := r.started[e.Test]; ok && !e.Time.IsZero() && e.Time.Sub(start) > elapsed {
		elapsed = e.Time.Sub(start)
	}
	r.got[e.Test] = result{Action: e.Action, Elapsed: elapsed}
	if r.progress != nil {
		r.progress(e, r.got[e.Test])
	}
}

func (r *eventReader) results() map[string]result {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]result, len(r.got))
	for k, v := range r.got {
		out[k] = v
	}
	return out
}

// teeLines writes everything to w and each complete line to r (a line
// may arrive in pieces).
type teeLines struct {
	w       io.Writer
	r       *eventReader
	pending []byte
}

func (t *teeLines) Write(p []byte) (int, error) {
	t.pending = append(t.pending, p...)
	for {
		i := bytes.IndexByte(t.pending, '\n')
		if i < 0 {
			break
		}
		t.r.line(t.pending[:i])
		t.pending = t.pending[i+1:]
	}
	return t.w.Write(p)
}

// renderTable is the Markdown table of the runs: a row per scenario, a
// column per minor.
func renderTable(chosen []scenario, cols []column) string {
	var b strings.Builder
	b.WriteString("| scenario | test |")
	for _, c := range cols {
		fmt.Fprintf(&b, " %s (%s) |", c.Release.Minor, c.Release.Version)
	}
	b.WriteString("\n|---|---|")
	for range cols {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	for _, s := range chosen {
		fmt.Fprintf(&b, "| %s | `%s` %s |", s.What, strings.Trim(s.Package, "./"), s.Test)
		for _, c := range cols {
			fmt.Fprintf(&b, " %s |", cell(c, s))
		}
		b.WriteString("\n")
	}
	b.WriteString("| upstream binaries | build, or kept from an earlier run |")
	for _, c := range cols {
		if c.BuildErr != nil {
			fmt.Fprintf(&b, " FAIL %s |", formatDuration(c.Build))
		} else {
			fmt.Fprintf(&b, " %s |", formatDuration(c.Build))
		}
	}
	b.WriteString("\n| binaries' --version | |")
	for _, c := range cols {
		fmt.Fprintf(&b, " %s |", c.Says)
	}
	b.WriteString("\n| total | |")
	for _, c := range cols {
		fmt.Fprintf(&b, " %s |", formatDuration(c.Total))
	}
	b.WriteString("\n")
	return b.String()
}

func cell(c column, s scenario) string {
	r, ok := c.Results[s.Test]
	if !ok {
		return "not run"
	}
	action := r.Action
	if action == "fail" {
		action = "FAIL"
	}
	return action + " " + formatDuration(r.Elapsed)
}

// allPassed: every chosen scenario passed on every minor.
func allPassed(chosen []scenario, cols []column) bool {
	for _, c := range cols {
		for _, s := range chosen {
			if r := c.Results[s.Test]; r.Action != "pass" {
				return false
			}
		}
	}
	return true
}

// formatDuration is "41s" or "1m02s".
func formatDuration(d time.Duration) string {
	d = d.Round(time.Second)
	if d < time.Minute {
		return fmt.Sprintf("%ds", int(d.Seconds()))
	}
	return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
}
