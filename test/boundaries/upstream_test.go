package boundaries

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// upstreamModulePrefix is the import path of everything under
// test/upstream: the released Kubernetes components and the external
// attacher the tests build, one module per folder (the newest Kubernetes,
// kubernetes-<minor> for each older minor make test-versions runs).
const upstreamModulePrefix = "github.com/latchcsi/latch/test/upstream"

// Each folder under test/upstream is a module of its own, named after the
// folder: without its go.mod its packages (a kubelet program, and through
// its imports all of Kubernetes) would be part of latch's module, where
// go test ./... enters them and a production package could import them.
func TestEveryUpstreamFolderIsAModuleOfItsOwn(t *testing.T) {
	root := repoRoot(t)
	entries, err := os.ReadDir(filepath.Join(root, "test", "upstream"))
	if err != nil {
		t.Fatal(err)
	}
	modules := 0
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		gomod, err := os.ReadFile(filepath.Join(root, "test", "upstream", e.Name(), "go.mod"))
		if err != nil {
			t.Errorf("test/upstream/%s has no go.mod: its packages belong to latch's module (%v)", e.Name(), err)
			continue
		}
		want := "module " + upstreamModulePrefix + "/" + e.Name() + "\n"
		if !strings.HasPrefix(string(gomod), want) {
			t.Errorf("test/upstream/%s/go.mod does not start with %q", e.Name(), strings.TrimSpace(want))
		}
		modules++
	}
	if modules < 2 {
		t.Fatalf("found %d modules under test/upstream, want the external-attacher's and Kubernetes'", modules)
	}
	// go list ./... of latch's module lists none of their packages.
	cmd := exec.Command("go", "list", "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list ./...: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if strings.HasPrefix(pkg, upstreamModulePrefix+"/") {
			t.Errorf("latch's module contains %s", pkg)
		}
	}
}

// No production binary links a package of test/upstream.
func TestProductionBinariesDoNotLinkTheUpstreamModules(t *testing.T) {
	root := repoRoot(t)
	for _, bin := range productionBinaries {
		if bad := depsUnder(t, root, bin, []string{upstreamModulePrefix}); len(bad) > 0 {
			t.Errorf("%s links %v", bin, bad)
		}
	}
}
