package testsupport

import (
	"os/exec"
	"strings"
	"testing"
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
