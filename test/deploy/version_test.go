package deploy_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart/loader"
	appsv1 "k8s.io/api/apps/v1"

	"github.com/latchcsi/latch/internal/version"
)

// latch's version is written once, in internal/version/VERSION. Everything
// that names a version of latch must say the same: the binaries, the image
// tags make image builds, the chart, the images of deploy/ and the chart,
// and CHANGELOG.md.
func TestOneVersionEverywhere(t *testing.T) {
	root := repoRoot(t)
	raw, err := os.ReadFile(filepath.Join(root, "internal/version/VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	v := strings.TrimSpace(string(raw))
	if version.Version != v {
		t.Fatalf("version.Version = %q, internal/version/VERSION says %q", version.Version, v)
	}

	bin := binaries(t)
	runs := [][]string{{"latchctl", "version"}}
	for _, b := range releasedBinaries {
		runs = append(runs, []string{b, "--version"})
	}
	for _, run := range runs {
		out, err := exec.Command(filepath.Join(bin, run[0]), run[1:]...).CombinedOutput()
		if err != nil {
			t.Errorf("%v: %v\n%s", run, err, out)
			continue
		}
		if fields := strings.Fields(string(out)); len(fields) != 2 || fields[1] != v {
			t.Errorf("%v printed %q, want \"<name> %s\"", run, out, v)
		}
	}

	makefile, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^IMAGE_TAG \?= \$\(shell cat internal/version/VERSION\)$`).Match(makefile) {
		t.Error("the Makefile's IMAGE_TAG does not default to internal/version/VERSION")
	}

	ch, err := loader.Load(filepath.Join(root, chartDir))
	if err != nil {
		t.Fatal(err)
	}
	if ch.Metadata.AppVersion != v || ch.Metadata.Version != strings.TrimPrefix(v, "v") {
		t.Errorf("Chart.yaml version %q appVersion %q, want %q and %q", ch.Metadata.Version, ch.Metadata.AppVersion, strings.TrimPrefix(v, "v"), v)
	}

	images := 0
	checkImages := func(where string, ds []string) {
		for _, image := range ds {
			if !strings.HasPrefix(image, "ghcr.io/latchcsi/") {
				continue
			}
			images++
			if _, tag, _ := strings.Cut(image, ":"); tag != v {
				t.Errorf("%s: image %s, want tag %s", where, image, v)
			}
		}
	}
	for _, dir := range kustomizations(t) {
		checkImages(dir, imagesOf(t, deployments(t, kustomize(t, dir))))
	}
	for _, set := range valueSets {
		checkImages("chart: "+set.name, imagesOf(t, deployments(t, mustHelmTemplate(t, set.namespace, set.values))))
	}
	if images == 0 {
		t.Fatal("no latch image found in deploy/ or the chart")
	}

	changelog, err := os.ReadFile(filepath.Join(root, "CHANGELOG.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^## ` + regexp.QuoteMeta(v) + `\b`).Match(changelog) {
		t.Errorf("CHANGELOG.md has no section \"## %s\"", v)
	}
}

// imagesOf lists the images of every container of ds.
func imagesOf(t *testing.T, ds []*appsv1.Deployment) []string {
	t.Helper()
	var out []string
	for _, d := range ds {
		for _, c := range append(d.Spec.Template.Spec.InitContainers, d.Spec.Template.Spec.Containers...) {
			out = append(out, c.Image)
		}
	}
	return out
}
