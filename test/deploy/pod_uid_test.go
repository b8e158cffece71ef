package deploy_test

import (
	"testing"

	v1 "k8s.io/api/core/v1"
)

// Every shipped csi-attacher container gets its Pod's UID as POD_UID from
// the downward API: without --leader-election (the chart's
// csiAttacher.leaderElection=false, or a flag edited away) a restarted
// container then recognises the Lease its previous process held and
// resumes at once, instead of waiting a lease duration and reporting its
// own predecessor as a competing instance (docs/csi-attacher.md).
func TestEveryAttacherManifestPassesThePodUID(t *testing.T) {
	seen := 0
	check := func(where string, c v1.Container) {
		seen++
		for _, e := range c.Env {
			if e.Name == "POD_UID" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.uid" {
				return
			}
		}
		t.Errorf("%s: csi-attacher env %v, want POD_UID from the downward API (fieldPath metadata.uid)", where, c.Env)
	}
	for _, dir := range kustomizations(t) {
		for name, c := range attacherContainers(deployments(t, kustomize(t, dir))) {
			check(dir+" "+name, c)
		}
	}
	for _, le := range []bool{true, false} {
		vals := map[string]any{"driver": map[string]any{"enabled": true}, "csiAttacher": map[string]any{"leaderElection": le}}
		for name, c := range attacherContainers(deployments(t, mustHelmTemplate(t, "drv", vals))) {
			check("chart "+name, c)
		}
	}
	if seen < 4 {
		t.Fatalf("checked %d csi-attacher containers, want the mock-driver example, the scrape overlay and the chart twice", seen)
	}
}
