package deploy_test

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// tuningFlags are the flags the chart sets from its values whose default
// value must be the binary's own default, so that installing with Helm
// gives the same pace and timeouts as running the binary bare. (Flags the
// chart sets on purpose to something else, such as --leader-election or
// --v, are not listed.)
var tuningFlags = map[string][]string{
	"csi-attacher": {"timeout", "worker-threads", "retry-interval-start", "retry-interval-max", "reconcile-sync", "kube-api-qps", "kube-api-burst"},
	"attachdetach-controller": {"concurrent-attach-detach-syncs", "max-wait-for-unmount", "disable-force-detach-on-timeout",
		"kube-api-qps", "kube-api-burst"},
}

var helpFlag = regexp.MustCompile(`(?m)^  -([a-z0-9-]+)(?: [a-z0-9.]+)?\n((?:    \t.*\n?)*)`)
var helpDefault = regexp.MustCompile(`\(default ([^)]*)\)\s*$`)

// binaryDefaults reads each flag's default from a binary's --help (Go's
// flag package prints "(default X)" after the usage unless X is the zero
// value).
func binaryDefaults(t *testing.T, bin string) map[string]string {
	t.Helper()
	out, _ := exec.Command(filepath.Join(binaries(t), bin), "--help").CombinedOutput()
	defaults := map[string]string{}
	for _, m := range helpFlag.FindAllStringSubmatch(string(out), -1) {
		defaults[m[1]] = ""
		if d := helpDefault.FindStringSubmatch(strings.TrimSpace(m[2])); d != nil {
			defaults[m[1]] = d[1]
		}
	}
	if len(defaults) < 10 {
		t.Fatalf("%s --help: found only %d flags in:\n%s", bin, len(defaults), out)
	}
	return defaults
}

// sameValue compares a chart value with a --help default: durations by
// length (1m and 1m0s), numbers by text, and a zero value (printed as no
// default) with its spellings.
func sameValue(chart, def string) bool {
	if chart == def {
		return true
	}
	if cd, err := time.ParseDuration(chart); err == nil {
		if dd, err := time.ParseDuration(def); err == nil {
			return cd == dd
		}
		return def == "" && cd == 0
	}
	return def == "" && (chart == "false" || chart == "0" || chart == "")
}

func TestHelmDefaultsAreTheBinariesDefaults(t *testing.T) {
	objs := mustHelmTemplate(t, "latch-helm-defaults", map[string]any{"driver": map[string]any{"enabled": true}})
	checked := map[string]int{}
	for _, d := range deployments(t, objs) {
		for _, c := range d.Spec.Template.Spec.Containers {
			bin, ok := latchBinary(c.Image)
			if !ok || tuningFlags[bin] == nil {
				continue
			}
			defaults := binaryDefaults(t, bin)
			args := map[string]string{}
			for _, a := range c.Args {
				name, value, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
				args[name] = value
			}
			for _, flag := range tuningFlags[bin] {
				def, known := defaults[flag]
				if !known {
					t.Errorf("%s has no flag --%s", bin, flag)
					continue
				}
				got, set := args[flag]
				if !set {
					t.Errorf("chart's %s container does not set --%s; drop it from tuningFlags or render it", bin, flag)
					continue
				}
				checked[bin]++
				if !sameValue(got, def) {
					t.Errorf("chart's default --%s=%s for %s, but the binary's default is %q (charts/latch/values.yaml)", flag, got, bin, def)
				}
			}
		}
	}
	for bin, flags := range tuningFlags {
		if checked[bin] != len(flags) {
			t.Errorf("checked %d of %d flags of %s: the chart did not render its container", checked[bin], len(flags), bin)
		}
	}
}

func TestSameValueTellsDefaultsApart(t *testing.T) {
	for _, c := range []struct {
		chart, def string
		want       bool
	}{
		{"1m", "1m0s", true}, {"15s", "15s", true}, {"6m", "6m0s", true}, {"5m", "6m0s", false},
		{"50", "50", true}, {"10", "50", false}, {"200", "5000", false},
		{"false", "", true}, {"true", "", false}, {"0s", "", true},
	} {
		if got := sameValue(c.chart, c.def); got != c.want {
			t.Errorf("sameValue(%q, %q) = %v, want %v", c.chart, c.def, got, c.want)
		}
	}
}
