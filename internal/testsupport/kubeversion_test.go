package testsupport

import (
	"strings"
	"testing"
)

// Every older minor of the support table has its module, each pinning a
// patch of that minor, and the newest comes from test/upstream/kubernetes.
func TestKubernetesReleasesAreTheMinorsOfTheSupportTable(t *testing.T) {
	all, err := KubernetesReleases()
	if err != nil {
		t.Fatal(err)
	}
	byMinor := map[string]KubernetesRelease{}
	for i, r := range all {
		byMinor[r.Minor] = r
		if !strings.HasPrefix(r.Version, "v"+r.Minor+".") {
			t.Errorf("%s pins %s, not a patch of %s", r.Module, r.Version, r.Minor)
		}
		if i > 0 && compareMinor(all[i-1].Minor, r.Minor) >= 0 {
			t.Errorf("releases out of order: %v", all)
		}
	}
	for _, minor := range []string{"1.34", "1.35", "1.36"} {
		if r, ok := byMinor[minor]; !ok || r.Module != "kubernetes-"+minor {
			t.Errorf("Kubernetes %s: %+v, want the module kubernetes-%s", minor, r, minor)
		}
	}
	// The newest comes from test/upstream/kubernetes (unless a module of
	// its own pins that minor too, as while latch moves to the next).
	newest, err := pinnedKubernetes(upstreamRoot() + "/kubernetes/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	if last := all[len(all)-1]; last.Minor != minorOf(newest) {
		t.Errorf("newest release %+v, want Kubernetes %s (test/upstream/kubernetes pins %s)", last, minorOf(newest), newest)
	}
}

func TestSelectedKubernetes(t *testing.T) {
	t.Setenv(KubernetesVersionEnv, "")
	if _, ok, err := SelectedKubernetes(); ok || err != nil {
		t.Errorf("unset: ok %v, err %v; want the default", ok, err)
	}
	t.Setenv(KubernetesVersionEnv, "v1.34")
	if r, ok, err := SelectedKubernetes(); !ok || err != nil || r.Module != "kubernetes-1.34" {
		t.Errorf("v1.34: %+v, %v, %v", r, ok, err)
	}
	if r, ok, err := ExternalAPIServer(); !ok || err != nil || r.Minor != "1.34" {
		t.Errorf("1.34's API server: %+v, %v, %v; want the external one", r, ok, err)
	}
	t.Setenv(KubernetesVersionEnv, "1.29")
	_, _, err := SelectedKubernetes()
	if err == nil || !strings.Contains(err.Error(), "1.29") || !strings.Contains(err.Error(), "1.34") {
		t.Errorf("1.29: error %v, want one naming 1.29 and the minors there are", err)
	}
}

func TestInModuleMovesOurPackagesOnly(t *testing.T) {
	hollow := Module + "/test/upstream/kubernetes/hollowkubelet"
	if got, want := inModule(hollow, "kubernetes", "kubernetes-1.34"), Module+"/test/upstream/kubernetes-1.34/hollowkubelet"; got != want {
		t.Errorf("inModule(hollow kubelet) = %s, want %s", got, want)
	}
	if got := inModule("k8s.io/kubernetes/cmd/kube-scheduler", "kubernetes", "kubernetes-1.34"); got != "k8s.io/kubernetes/cmd/kube-scheduler" {
		t.Errorf("inModule(kube-scheduler) = %s", got)
	}
}
