package testsupport

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// KubernetesVersionEnv selects the Kubernetes minor (e.g. "1.34") whose
// kube-apiserver, kube-controller-manager, kube-scheduler and kubelet a
// test run uses: the upstream components are built from the module
// test/upstream/kubernetes-<minor> (test/upstream/kubernetes for the
// newest), and localcluster runs that release's kube-apiserver binary
// when it is not the in-process one. Unset: the newest, with the
// in-process API server (what make test runs). make test-versions sets
// it for each minor of the support table (docs/upgrade.md).
const KubernetesVersionEnv = "LATCH_TEST_KUBERNETES"

// newestKubernetesModule is the module of the newest release, the one
// make test uses; older minors are in newestKubernetesModule-<minor>.
const newestKubernetesModule = "kubernetes"

// A KubernetesRelease is a Kubernetes release the tests can build their
// upstream components from.
type KubernetesRelease struct {
	// Minor is "1.34".
	Minor string
	// Version is the k8s.io/kubernetes version its module pins: "v1.34.5".
	Version string
	// Module is its directory under test/upstream.
	Module string
}

// SelectedKubernetes is the release KubernetesVersionEnv names; ok is
// false when it is unset (the newest, built from test/upstream/kubernetes,
// and the in-process API server). A minor no module pins is an error
// naming those that exist.
func SelectedKubernetes() (r KubernetesRelease, ok bool, err error) {
	minor := strings.TrimPrefix(strings.TrimSpace(os.Getenv(KubernetesVersionEnv)), "v")
	if minor == "" {
		return KubernetesRelease{}, false, nil
	}
	all, err := KubernetesReleases()
	if err != nil {
		return KubernetesRelease{}, false, err
	}
	var minors []string
	for _, r := range all {
		if r.Minor == minor {
			return r, true, nil
		}
		minors = append(minors, r.Minor)
	}
	return KubernetesRelease{}, false, fmt.Errorf("%s=%s: no module under test/upstream pins Kubernetes %s (there are: %s)", KubernetesVersionEnv, minor, minor, strings.Join(minors, ", "))
}

// KubernetesReleases are the releases test/upstream has a module for,
// oldest first: one kubernetes-<minor> module per older minor and the
// newest (test/upstream/kubernetes). Where a minor has both, its own
// kubernetes-<minor> module wins (while latch moves to a new minor, the
// newest module may still pin the previous one).
func KubernetesReleases() ([]KubernetesRelease, error) {
	root := upstreamRoot()
	dirs, err := filepath.Glob(filepath.Join(root, newestKubernetesModule+"-1.*"))
	if err != nil {
		return nil, err
	}
	dirs = append(dirs, filepath.Join(root, newestKubernetesModule))
	byMinor := map[string]KubernetesRelease{}
	for _, dir := range dirs {
		v, err := pinnedKubernetes(filepath.Join(dir, "go.mod"))
		if err != nil {
			return nil, err
		}
		r := KubernetesRelease{Minor: minorOf(v), Version: v, Module: filepath.Base(dir)}
		if _, dup := byMinor[r.Minor]; dup && r.Module == newestKubernetesModule {
			continue
		}
		byMinor[r.Minor] = r
	}
	out := make([]KubernetesRelease, 0, len(byMinor))
	for _, r := range byMinor {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b KubernetesRelease) int { return compareMinor(a.Minor, b.Minor) })
	return out, nil
}

// pinnedKubernetes is the k8s.io/kubernetes version the go.mod at path
// requires.
func pinnedKubernetes(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(strings.TrimPrefix(strings.TrimSpace(sc.Text()), "require "))
		if len(fields) >= 2 && fields[0] == "k8s.io/kubernetes" && strings.HasPrefix(fields[1], "v1.") {
			return fields[1], nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	return "", fmt.Errorf("%s requires no k8s.io/kubernetes", path)
}

// minorOf is "1.34" for "v1.34.5".
func minorOf(version string) string {
	parts := strings.SplitN(strings.TrimPrefix(version, "v"), ".", 3)
	if len(parts) < 2 {
		return version
	}
	return parts[0] + "." + parts[1]
}

// compareMinor orders "1.9" before "1.34".
func compareMinor(a, b string) int {
	var am, an, bm, bn int
	fmt.Sscanf(a, "%d.%d", &am, &an)
	fmt.Sscanf(b, "%d.%d", &bm, &bn)
	if am != bm {
		return am - bm
	}
	return an - bn
}

// kubernetesModule is the module directory under test/upstream the
// components of module build from in this run: the selected release's
// for the Kubernetes module, module itself otherwise. flags are the go
// build flags of a selected release's binaries: its version stamped in as
// Kubernetes' own release build does (hack/lib/version.sh), so that
// /version and a Node's kubeletVersion name it (a plain go build says
// v0.0.0-master). The stamp only changes what the linker writes; the
// compiled packages are the same. Every upstream binary is linked with -w
// (noDebugInfo).
func kubernetesModule(module string) (dir string, flags []string, err error) {
	if module != newestKubernetesModule {
		return module, []string{noDebugInfo}, nil
	}
	r, ok, err := SelectedKubernetes()
	if err != nil || !ok {
		return module, []string{noDebugInfo}, err
	}
	x := []string{"-w"}
	for _, pkg := range []string{"k8s.io/component-base/version", "k8s.io/client-go/pkg/version"} {
		x = append(x, "-X "+pkg+".gitVersion="+r.Version, "-X "+pkg+".gitMajor=1",
			"-X "+pkg+".gitMinor="+strings.TrimPrefix(r.Minor, "1."), "-X "+pkg+".gitTreeState=clean")
	}
	return r.Module, []string{"-ldflags=" + strings.Join(x, " ")}, nil
}

// noDebugInfo links the upstream binaries without DWARF debug information
// (-w; stack traces keep their file and line): nothing debugs them, and
// their links are the last step of a cold make demo (kube-controller-manager,
// kube-scheduler and the hollow kubelet at once on two cores) and a part of
// test/interop's first test on a cold cache.
const noDebugInfo = "-ldflags=-w"

// inModule is importPath of a package of ours in the module
// test/upstream/<from> (e.g. the hollow kubelet) as the same package of
// test/upstream/<to>; any other import path is unchanged.
func inModule(importPath, from, to string) string {
	prefix := Module + "/test/upstream/" + from + "/"
	if from == to || !strings.HasPrefix(importPath, prefix) {
		return importPath
	}
	return Module + "/test/upstream/" + to + "/" + strings.TrimPrefix(importPath, prefix)
}

// ExternalAPIServer is the release whose kube-apiserver binary
// localcluster runs instead of its in-process API server: set (ok) when
// KubernetesVersionEnv selects a release other than the one latch's own
// go.mod pins, which is the in-process API server's.
func ExternalAPIServer() (r KubernetesRelease, ok bool, err error) {
	r, ok, err = SelectedKubernetes()
	if err != nil || !ok {
		return r, false, err
	}
	inProcess, err := InProcessKubernetes()
	if err != nil {
		return r, false, err
	}
	return r, r.Version != inProcess, nil
}

// InProcessKubernetes is the k8s.io/kubernetes version latch's go.mod
// pins: the in-process API server's.
func InProcessKubernetes() (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	return pinnedKubernetes(filepath.Join(root, "go.mod"))
}
