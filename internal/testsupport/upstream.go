package testsupport

import (
	"fmt"
	"maps"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
)

// An upstream component is a released Kubernetes binary that latch's tests
// run beside (or instead of) latch's own, built from Go modules at the
// exact release its module under test/upstream pins. Each module there is
// separate from latch's own go.mod, so that nothing of it can reach a latch
// binary and each can keep what its release needs at its own version;
// every other dependency is at latch's version (upstreammods.go), so the
// packages latch-local and the tests compiled are not compiled again for
// it.
type upstream struct {
	module     string // directory under test/upstream
	importPath string
	// together: built in one go build with the other components of its
	// module that set it (latch-local and the end-to-end tests run them
	// side by side; built apart, a cold machine linked them one after the
	// other and ran three go commands over the same packages).
	together bool
}

// The upstream components tests can build, by the name their docs use.
var upstreamComponents = map[string]upstream{
	// external-attacher v4.13.0: the CSI external-attacher sidecar that
	// csi-attacher replaces, built with latch's dependency versions (its
	// release's Kubernetes libraries are v0.37 like latch's, so its flags
	// and feature gates are the release's).
	"external-attacher": {"external-attacher", "github.com/kubernetes-csi/external-attacher/v4/cmd/csi-attacher", false},
	// kube-controller-manager v1.37.2: its attach/detach controller is the
	// one attachdetach-controller replaces.
	"kube-controller-manager": {"kubernetes", "k8s.io/kubernetes/cmd/kube-controller-manager", true},
	"kube-scheduler":          {"kubernetes", "k8s.io/kubernetes/cmd/kube-scheduler", true},
	// kubemark: kubemark's hollow node as released (its kubelet attaches
	// volumes itself: EnableControllerAttachDetach is off).
	"kubemark": {"kubernetes", "k8s.io/kubernetes/cmd/kubemark", false},
	// hollow-kubelet: the real kubelet code of v1.37.2 with kubemark's fake
	// container runtime and mounter, started by a small program of ours
	// (test/upstream/kubernetes/hollowkubelet) that keeps attach/detach
	// controller-managed, serves on loopback and takes a root directory.
	"hollow-kubelet": {"kubernetes", "github.com/latchcsi/latch/test/upstream/kubernetes/hollowkubelet", true},
	// kube-apiserver: the API server of a release other than the
	// in-process one (KubernetesVersionEnv; localcluster runs it).
	"kube-apiserver": {"kubernetes", "k8s.io/kubernetes/cmd/kube-apiserver", false},
}

// UpstreamBinary builds an upstream component (a key of the list above, e.g.
// "external-attacher" or "kube-controller-manager") once per test process
// and returns its path; kube-controller-manager, kube-scheduler and the
// hollow kubelet are built together, whichever is asked for first. A cold
// build takes minutes (kube-controller-manager links most of Kubernetes);
// later ones come from the Go build cache. The Kubernetes components come
// from the release KubernetesVersionEnv selects (the newest when unset).
func UpstreamBinary(component string) (string, error) {
	u, ok := upstreamComponents[component]
	if !ok {
		names := make([]string, 0, len(upstreamComponents))
		for n := range upstreamComponents {
			names = append(names, n)
		}
		slices.Sort(names)
		return "", fmt.Errorf("no upstream component %q (known: %s)", component, strings.Join(names, ", "))
	}
	module, flags, err := kubernetesModule(u.module)
	if err != nil {
		return "", fmt.Errorf("build %s: %w", component, err)
	}
	label, paths := upstreamBuild(component)
	for i, p := range paths {
		paths[i] = inModule(p, u.module, module)
	}
	dir := filepath.Join(upstreamRoot(), module)
	if len(paths) == 1 {
		return buildOnce(dir, paths[0], flags...)
	}
	bins, err := buildTogether(label, dir, paths, flags...)
	if err != nil {
		return "", err
	}
	return bins[inModule(u.importPath, u.module, module)], nil
}

// upstreamBuild is what building component builds: its own import path,
// or those of every component of its module built together with it (by
// name), and the label of its progress lines.
func upstreamBuild(component string) (label string, importPaths []string) {
	u := upstreamComponents[component]
	if !u.together {
		return component, []string{u.importPath}
	}
	var names []string
	for _, name := range slices.Sorted(maps.Keys(upstreamComponents)) {
		if c := upstreamComponents[name]; c.together && c.module == u.module {
			importPaths, names = append(importPaths, c.importPath), append(names, name)
		}
	}
	return strings.Join(names, "+"), importPaths
}

// MustUpstreamBinary is UpstreamBinary that fails the test.
func MustUpstreamBinary(t TB, component string) string {
	t.Helper()
	p, err := UpstreamBinary(component)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return p
}

// upstreamRoot is test/upstream in this checkout.
func upstreamRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "test", "upstream")
}
