package latchlocal

import (
	"os"
	"testing"

	kubectlcmd "k8s.io/kubectl/pkg/cmd"

	"github.com/latchcsi/latch/internal/testsupport"
)

// TestMain removes the upstream binaries RealNodes built. Run with
// LATCH_TEST_RUN_KUBECTL=1, the test binary is kubectl instead (the docs'
// commands run it: docshell_test.go).
func TestMain(m *testing.M) {
	if os.Getenv(runAsKubectl) == "1" {
		os.Args[0] = "kubectl"
		if err := kubectlcmd.NewDefaultKubectlCommand().Execute(); err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	testsupport.RunTestMain(m)
}
