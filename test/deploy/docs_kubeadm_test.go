package deploy_test

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	kubeadmv1beta4 "k8s.io/kubernetes/cmd/kubeadm/app/apis/kubeadm/v1beta4"
	"sigs.k8s.io/yaml"

	"github.com/latchcsi/latch/internal/stack"
)

// docs/migration.md's kubeadm snippet (before turning kube-controller-
// manager's controller off) is a ClusterConfiguration kubeadm reads: it
// decodes strictly into kubeadm's own v1beta4 type (a misspelt field, or
// v1beta3's map form of extraArgs under v1beta4, fails), and it gives
// kube-controller-manager exactly the --controllers the runbook tests run
// it with. No kubeadm cluster runs in the tests; this is what can be
// checked without one.
func TestMigrationKubeadmSnippetIsAClusterConfigurationKubeadmReads(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(repoRoot(t), "docs", "migration.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := bytes.Cut(doc, []byte("**kubeadm:**"))
	if !ok {
		t.Fatal("docs/migration.md has no **kubeadm:** item")
	}
	_, block, ok := bytes.Cut(after, []byte("```yaml\n"))
	if !ok {
		t.Fatal("docs/migration.md: no yaml block in the kubeadm item")
	}
	lines := strings.Split(string(block), "\n")
	end := slices.IndexFunc(lines, func(l string) bool { return strings.TrimSpace(l) == "```" })
	if end < 0 {
		t.Fatal("docs/migration.md: the kubeadm block does not end")
	}
	snippet := strings.Join(lines[:end], "\n")
	var cfg kubeadmv1beta4.ClusterConfiguration
	if err := yaml.UnmarshalStrict([]byte(snippet), &cfg); err != nil {
		t.Fatalf("the kubeadm snippet is not a v1beta4 ClusterConfiguration kubeadm reads: %v\n%s", err, snippet)
	}
	if cfg.APIVersion != "kubeadm.k8s.io/v1beta4" || cfg.Kind != "ClusterConfiguration" {
		t.Errorf("the kubeadm snippet is %s %s, want kubeadm.k8s.io/v1beta4 ClusterConfiguration", cfg.APIVersion, cfg.Kind)
	}
	want := []kubeadmv1beta4.Arg{{Name: "controllers", Value: strings.Join(stack.ControllersExceptAttachDetach, ",")}}
	if got := cfg.ControllerManager.ExtraArgs; !slices.Equal(got, want) {
		t.Errorf("the kubeadm snippet gives kube-controller-manager %+v, want %+v", got, want)
	}
}
