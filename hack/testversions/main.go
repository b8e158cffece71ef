// Command testversions runs latch's core end-to-end scenarios against each
// Kubernetes minor of the support table (make test-versions;
// docs/upgrade.md, "Tested Kubernetes versions"): for every minor, the
// kube-apiserver, kube-controller-manager, kube-scheduler and hollow
// kubelet of that release, each built from its module under test/upstream
// (kubernetes-<minor>, test/upstream/kubernetes for the newest) and kept
// between runs like the other upstream binaries
// (internal/testsupport.KubernetesVersionEnv).
//
//	go run ./hack/testversions [-versions 1.34,1.35] [-scenarios multi-attach,kcm-swap] [-out bin/test-versions]
//
// It builds each scenario's test package once (go test -c; the tests do
// not depend on the version), then for each minor: the upstream binaries
// (progress on standard error), then the scenarios' tests, one test binary
// per package with -run naming its scenarios, under go tool test2json. A
// scenario is one existing test; it passes when its test passed.
//
// Output: progress on standard error; on standard output, once every
// minor has run, a Markdown table with one row per scenario and one column
// per minor, each cell "pass 41s", "FAIL 1m02s" or "skip 0s" (from the
// test's start to its outcome, by go test's JSON events), or "not run" when the test binary ended
// without reporting the test (a crash, a timeout, or a build failure of
// the minor's binaries); a row "upstream binaries" gives each minor's
// build time (seconds when the binaries were kept from an earlier run), a
// row "binaries' --version" what kube-apiserver (or "in-process" when
// latch's own API server is of that release), kube-controller-manager and
// kube-scheduler answer to --version, and a row "total" each minor's wall
// time. The same table is written to
// <out>/table.md, and each test binary's JSON events to
// <out>/<minor>/<package>.json, where a failed test's log is. The exit
// status is 1 when any scenario did not pass.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/latchcsi/latch/internal/testsupport"
)

func main() {
	var (
		versions  = flag.String("versions", "", "comma-separated Kubernetes minors (default: every minor test/upstream has a module for)")
		only      = flag.String("scenarios", "", "comma-separated scenario names (default: all: "+strings.Join(scenarioNames(), ",")+")")
		out       = flag.String("out", filepath.Join("bin", "test-versions"), "directory for the test binaries, JSON logs and table.md")
		timeout   = flag.Duration("timeout", 20*time.Minute, "go test -timeout of each test binary run")
		buildOnly = flag.Bool("build-only", false, "only build each minor's upstream binaries and the test binaries")
	)
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ok, err := run(ctx, *versions, *only, *out, *timeout, *buildOnly)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testversions:", err)
		os.Exit(2)
	}
	if !ok {
		os.Exit(1)
	}
}

func run(ctx context.Context, versions, only, out string, timeout time.Duration, buildOnly bool) (bool, error) {
	releases, err := selectReleases(versions)
	if err != nil {
		return false, err
	}
	chosen, err := selectScenarios(only)
	if err != nil {
		return false, err
	}
	if out, err = filepath.Abs(out); err != nil {
		return false, err
	}
	bins, err := buildTests(ctx, chosen, filepath.Join(out, "tests"))
	if err != nil {
		return false, err
	}
	testsupport.SetBuildProgress(os.Stderr)
	var columns []column
	for _, r := range releases {
		col := column{Release: r, Results: map[string]result{}}
		start := time.Now()
		logf("Kubernetes %s (%s, test/upstream/%s): building its upstream binaries", r.Minor, r.Version, r.Module)
		says, buildErr := buildUpstream(r)
		col.Says = says
		col.Build = time.Since(start)
		if buildErr != nil {
			logf("Kubernetes %s: %v", r.Minor, buildErr)
			col.BuildErr = buildErr
		} else if !buildOnly {
			for _, pkg := range packagesOf(chosen) {
				if ctx.Err() != nil {
					return false, ctx.Err()
				}
				res, err := runPackage(ctx, r, pkg, chosen, bins[pkg], filepath.Join(out, r.Minor), timeout)
				if err != nil {
					logf("Kubernetes %s, %s: %v", r.Minor, pkg, err)
				}
				for name, v := range res {
					col.Results[name] = v
				}
			}
		}
		col.Total = time.Since(start)
		columns = append(columns, col)
		logf("Kubernetes %s done in %s", r.Minor, col.Total.Round(time.Second))
	}
	if buildOnly {
		return true, nil
	}
	table := renderTable(chosen, columns)
	fmt.Print(table)
	if err := os.WriteFile(filepath.Join(out, "table.md"), []byte(table), 0o644); err != nil {
		return false, err
	}
	return allPassed(chosen, columns), nil
}

// selectReleases are the releases versions names, or all.
func selectReleases(versions string) ([]testsupport.KubernetesRelease, error) {
	all, err := testsupport.KubernetesReleases()
	if err != nil {
		return nil, err
	}
	if versions == "" {
		return all, nil
	}
	var out []testsupport.KubernetesRelease
	for _, v := range strings.Split(versions, ",") {
		v = strings.TrimPrefix(strings.TrimSpace(v), "v")
		i := slices.IndexFunc(all, func(r testsupport.KubernetesRelease) bool { return r.Minor == v })
		if i < 0 {
			var minors []string
			for _, r := range all {
				minors = append(minors, r.Minor)
			}
			return nil, fmt.Errorf("no module under test/upstream pins Kubernetes %s (there are: %s)", v, strings.Join(minors, ", "))
		}
		out = append(out, all[i])
	}
	return out, nil
}

// buildUpstream builds release r's kube-controller-manager, kube-scheduler
// and hollow kubelet (one go build), and its kube-apiserver when the tests
// run it instead of the in-process one, into the directory the tests find
// them in (testsupport.BinaryDirEnv). It returns what the binaries say
// with --version ("kube-apiserver in-process" when latch's own is used).
func buildUpstream(r testsupport.KubernetesRelease) (string, error) {
	os.Setenv(testsupport.KubernetesVersionEnv, r.Minor)
	defer os.Unsetenv(testsupport.KubernetesVersionEnv)
	components := []string{"kube-controller-manager", "kube-scheduler"}
	_, external, err := testsupport.ExternalAPIServer()
	if err != nil {
		return "", err
	}
	if external {
		components = append([]string{"kube-apiserver"}, components...)
	}
	var says []string
	if !external {
		says = append(says, "kube-apiserver in-process")
	}
	for _, c := range components {
		bin, err := testsupport.UpstreamBinary(c)
		if err != nil {
			return "", err
		}
		out, err := exec.Command(bin, "--version").Output()
		if err != nil {
			return "", fmt.Errorf("%s --version: %w", bin, err)
		}
		says = append(says, c+" "+strings.TrimPrefix(strings.TrimSpace(string(out)), "Kubernetes "))
	}
	return strings.Join(says, ", "), nil
}

// buildTests compiles each scenario package's test binary once into dir.
func buildTests(ctx context.Context, chosen []scenario, dir string) (map[string]string, error) {
	bins := map[string]string{}
	for _, pkg := range packagesOf(chosen) {
		bin := filepath.Join(dir, strings.ReplaceAll(strings.Trim(pkg, "./"), "/", "-")+".test")
		logf("go test -c %s", pkg)
		cmd := exec.CommandContext(ctx, "go", "test", "-c", "-o", bin, pkg)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("go test -c %s: %w", pkg, err)
		}
		bins[pkg] = bin
	}
	return bins, nil
}

// runPackage runs pkg's scenarios of chosen against release r: its test
// binary under go tool test2json, in the package's directory (as go test
// runs it), the JSON events to dir/<package>.json.
func runPackage(ctx context.Context, r testsupport.KubernetesRelease, pkg string, chosen []scenario, bin, dir string, timeout time.Duration) (map[string]result, error) {
	var tests []string
	for _, s := range chosen {
		if s.Package == pkg {
			tests = append(tests, s.Test)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, strings.ReplaceAll(strings.Trim(pkg, "./"), "/", "-")+".json")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	run := "^(" + strings.Join(tests, "|") + ")$"
	logf("Kubernetes %s: %s -run '%s' (log: %s)", r.Minor, pkg, run, logPath)
	cmd := exec.CommandContext(ctx, "go", "tool", "test2json", "-t", "-p", strings.Trim(pkg, "./"),
		bin, "-test.v=test2json", "-test.count=1", "-test.timeout="+timeout.String(), "-test.run="+run)
	cmd.Dir = pkg
	cmd.Env = append(os.Environ(), testsupport.KubernetesVersionEnv+"="+r.Minor)
	cmd.Stderr = logFile
	events := &eventReader{progress: func(e event, res result) {
		logf("Kubernetes %s: %s %s %s", r.Minor, e.Test, res.Action, formatDuration(res.Elapsed))
	}}
	cmd.Stdout = &teeLines{w: logFile, r: events}
	runErr := cmd.Run()
	return events.results(), runErr
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "make test-versions: "+format+"\n", args...)
}
