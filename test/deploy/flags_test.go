package deploy_test

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// deployedContainer is one container of a rendered manifest.
type deployedContainer struct {
	source string // kustomization or chart value set
	c      v1.Container
}

// latchBinary is the binary a latch image runs: its last path element
// without the tag, if that is a released binary.
func latchBinary(image string) (string, bool) {
	name := image[strings.LastIndex(image, "/")+1:]
	name, _, _ = strings.Cut(name, ":")
	name, _, _ = strings.Cut(name, "@")
	return name, slices.Contains(releasedBinaries, name)
}

var envRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// expandEnv does what the kubelet does with $(VAR) in args, for variables
// from fieldRefs (given a plausible value) and literal values.
func expandEnv(arg string, env []v1.EnvVar) string {
	return envRef.ReplaceAllStringFunc(arg, func(ref string) string {
		name := envRef.FindStringSubmatch(ref)[1]
		for _, e := range env {
			if e.Name != name {
				continue
			}
			if e.ValueFrom != nil {
				return "value-of-" + strings.ToLower(name)
			}
			return e.Value
		}
		return ref
	})
}

// Every container that runs a latch binary, in every kustomization and
// chart value set, is started with its exact args followed by --help: the
// binary parses the args in order and exits 0 at --help only if each flag
// exists and each value parses.
func TestEveryManifestFlagExistsInItsBinary(t *testing.T) {
	var all []deployedContainer
	for _, dir := range kustomizations(t) {
		for _, d := range deployments(t, kustomize(t, dir)) {
			for _, c := range d.Spec.Template.Spec.Containers {
				all = append(all, deployedContainer{dir, c})
			}
		}
	}
	for _, vs := range valueSets {
		for _, d := range deployments(t, mustHelmTemplate(t, vs.namespace, vs.values)) {
			for _, c := range d.Spec.Template.Spec.Containers {
				all = append(all, deployedContainer{chartDir + " (" + vs.name + ")", c})
			}
		}
	}
	dir := binaries(t)
	seen := map[string]int{}
	for _, dc := range all {
		bin, ok := latchBinary(dc.c.Image)
		if !ok {
			continue // a third-party driver image in a chart example
		}
		seen[bin]++
		var args []string
		for _, a := range dc.c.Args {
			args = append(args, expandEnv(a, dc.c.Env))
		}
		if len(dc.c.Command) > 0 {
			t.Errorf("%s: container %s overrides the image's ENTRYPOINT with %v", dc.source, dc.c.Name, dc.c.Command)
		}
		t.Run(fmt.Sprintf("%s/%s", dc.source, dc.c.Name), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, filepath.Join(dir, bin), append(slices.Clone(args), "--help")...)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Errorf("%s %s --help: %v\n%s", bin, strings.Join(args, " "), err, lastLines(string(out), 5))
			}
		})
	}
	for _, b := range []string{"attachdetach-controller", "csi-attacher", "csi-mock-driver"} {
		if seen[b] == 0 {
			t.Errorf("no manifest runs %s: the check above proved nothing for it", b)
		}
	}
}

// An unknown flag really fails the check above.
func TestFlagCheckRejectsAnUnknownFlag(t *testing.T) {
	dir := binaries(t)
	for _, bin := range []string{"attachdetach-controller", "csi-attacher", "csi-mock-driver", "latchctl"} {
		out, err := exec.Command(filepath.Join(dir, bin), "--no-such-flag=1", "--help").CombinedOutput()
		if err == nil {
			t.Errorf("%s accepted --no-such-flag before --help:\n%s", bin, out)
		}
	}
	out, err := exec.Command(filepath.Join(dir, "csi-attacher"), "--timeout=soon", "--help").CombinedOutput()
	if err == nil {
		t.Errorf("csi-attacher accepted --timeout=soon before --help:\n%s", out)
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
