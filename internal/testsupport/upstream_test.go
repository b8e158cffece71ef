package testsupport

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/latchcsi/latch/internal/testsupport/gomodule"
)

func TestUpstreamBinaryNamesTheKnownComponentsWhenAskedForAnother(t *testing.T) {
	_, err := UpstreamBinary("kube-proxy")
	if err == nil || !strings.Contains(err.Error(), `"kube-proxy"`) || !strings.Contains(err.Error(), "external-attacher") {
		t.Fatalf("error = %v, want one naming the component and the known ones", err)
	}
}

// The upstream external-attacher builds from its pinned module and is the
// real thing: its --help lists the flags only upstream has in that form.
func TestUpstreamExternalAttacherBuildsAndRuns(t *testing.T) {
	bin := MustUpstreamBinary(t, "external-attacher")
	out, _ := exec.Command(bin, "--help").CombinedOutput()
	for _, want := range []string{"-leader-election-labels", "-csi-address", "ReleaseLeaderElectionOnExit"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("upstream csi-attacher --help lacks %q:\n%s", want, out)
		}
	}
}

// Every dependency an upstream module shares with latch is at latch's
// version, but those keepOwnVersion keeps (and those must still differ,
// else the exception is stale): a package compiled for latch-local or the
// tests is never compiled again for kube-controller-manager, the
// scheduler, the hollow kubelet or the external-attacher.
func TestUpstreamModulesBuildWithLatchsVersions(t *testing.T) {
	for _, name := range UpstreamModuleDirs() {
		drift, err := UpstreamVersionDrift(name)
		if err != nil {
			t.Fatal(err)
		}
		kept := map[string]bool{}
		for _, d := range drift {
			if d.KeepOwn {
				kept[d.Path] = true
				continue
			}
			t.Errorf("%s: it and every package above it compile twice on a cold machine; run make upstream-mods", d)
		}
		for k := range keepOwnVersion[name] {
			used := kept[k]
			for path := range kept {
				used = used || strings.HasSuffix(k, "/") && strings.HasPrefix(path, k)
			}
			if !used {
				t.Errorf("test/upstream/%s builds %s at latch's version, yet keepOwnVersion keeps its own: drop the exception", name, k)
			}
		}
	}
}

// The drift check can fail: two modules that require one dependency at
// different versions (local replacements, no download) drift on it, and
// only on it, and a kept module is marked so.
func TestVersionDriftFindsADependencyAtAnotherVersion(t *testing.T) {
	dep := func(version string) map[string]string {
		return map[string]string{
			"go.mod":      "module example.com/app\n\ngo 1.26\n\nrequire (\n\texample.com/dep " + version + "\n\texample.com/same v1.0.0\n)\n\nreplace example.com/dep => ./dep\n\nreplace example.com/same => ./same\n",
			"dep/go.mod":  "module example.com/dep\n\ngo 1.26\n",
			"same/go.mod": "module example.com/same\n\ngo 1.26\n",
		}
	}
	latch := gomodule.Write(t, "example.com/app", dep("v1.1.0"))
	theirs := gomodule.Write(t, "example.com/app", dep("v1.0.0"))
	drift, err := versionDrift("app", latch, theirs, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []VersionDrift{{Module: "app", Path: "example.com/dep", Theirs: "v1.0.0", Latch: "v1.1.0"}}
	if !slices.Equal(drift, want) {
		t.Fatalf("drift = %v, want %v", drift, want)
	}
	if s := drift[0].String(); s != "test/upstream/app builds example.com/dep v1.0.0, latch v1.1.0" {
		t.Errorf("String() = %q", s)
	}
	drift, err = versionDrift("app", latch, theirs, map[string]string{"example.com/dep": "because"})
	if err != nil {
		t.Fatal(err)
	}
	if len(drift) != 1 || !drift[0].KeepOwn || drift[0].Reason != "because" {
		t.Fatalf("drift = %+v, want example.com/dep kept for its reason", drift)
	}
}

// kube-controller-manager, kube-scheduler and the hollow kubelet (what
// latch-local and the end-to-end tests run side by side) are one go build,
// whichever is asked for first; the others are built alone.
func TestKubernetesComponentsAreBuiltTogether(t *testing.T) {
	together := []string{
		"github.com/latchcsi/latch/test/upstream/kubernetes/hollowkubelet",
		"k8s.io/kubernetes/cmd/kube-controller-manager",
		"k8s.io/kubernetes/cmd/kube-scheduler",
	}
	for _, c := range []string{"kube-controller-manager", "kube-scheduler", "hollow-kubelet"} {
		label, paths := upstreamBuild(c)
		if label != "hollow-kubelet+kube-controller-manager+kube-scheduler" || !slices.Equal(paths, together) {
			t.Errorf("%s builds %q as %v, want %v", c, label, paths, together)
		}
	}
	for c, want := range map[string]string{
		"kubemark":          "k8s.io/kubernetes/cmd/kubemark",
		"external-attacher": "github.com/kubernetes-csi/external-attacher/v4/cmd/csi-attacher",
	} {
		if label, paths := upstreamBuild(c); label != c || !slices.Equal(paths, []string{want}) {
			t.Errorf("%s builds %q as %v, want itself alone", c, label, paths)
		}
	}
}

// Every module under test/upstream builds with latch's versions but what
// keepOwnVersion keeps (the older Kubernetes minors of make test-versions
// aside): a new module must say what it keeps, and why.
func TestEveryUpstreamModuleSaysWhatItKeeps(t *testing.T) {
	entries, err := os.ReadDir(upstreamRoot())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		if strings.HasPrefix(e.Name(), newestKubernetesModule+"-") {
			// The older minors make test-versions builds are each
			// built as released, with the release's own versions
			// (KubernetesReleases): nothing to align with latch's.
			continue
		}
		n++
		if _, ok := keepOwnVersion[e.Name()]; !ok {
			t.Errorf("test/upstream/%s is not in keepOwnVersion", e.Name())
		}
	}
	if n != len(keepOwnVersion) {
		t.Errorf("%d modules under test/upstream, %d in keepOwnVersion", n, len(keepOwnVersion))
	}
}

// A kept prefix keeps every module under it, and only those.
func TestKeptReasonMatchesPathsAndPrefixes(t *testing.T) {
	keep := map[string]string{"k8s.io/": "prefix", "example.com/a": "exact"}
	for path, want := range map[string]string{
		"k8s.io/client-go": "prefix", "k8s.io/api": "prefix", "example.com/a": "exact",
		"sigs.k8s.io/yaml": "", "example.com/ab": "", "k8s.io": "",
	} {
		got, ok := keptReason(keep, path)
		if got != want || ok != (want != "") {
			t.Errorf("keptReason(%q) = %q, %v; want %q", path, got, ok, want)
		}
	}
}

// make demo and make up compile what latch-local's upstream binaries
// import while latch-local links (the Makefile's UPSTREAM_WARM, run by
// hack/buildprogress): it must name exactly the components built together
// from the newest Kubernetes module, or latch-local's own build of them
// would compile what the warm build left out.
func TestMakefileWarmsTheUpstreamComponentsBuiltTogether(t *testing.T) {
	makefile, err := os.ReadFile(filepath.Join(upstreamRoot(), "..", "..", "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^UPSTREAM_WARM := -warm-dir (\S+) -warm "([^"]*)"$`).FindSubmatch(makefile)
	if m == nil {
		t.Fatal(`Makefile: no line UPSTREAM_WARM := -warm-dir <dir> -warm "<packages>"`)
	}
	if got, want := string(m[1]), "test/upstream/"+newestKubernetesModule; got != want {
		t.Errorf("UPSTREAM_WARM's module directory = %q, want %q", got, want)
	}
	_, want := upstreamBuild("kube-controller-manager")
	got := strings.Fields(string(m[2]))
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("UPSTREAM_WARM's packages = %q, want the components built together: %q", got, want)
	}
}
