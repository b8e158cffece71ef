package testsupport

import (
	"os"
	"os/exec"
	"testing"
)

// asCommand, set to "1" in a test binary's environment, makes
// RunTestMainAsCommand run the command instead of the tests.
const asCommand = "LATCH_TEST_RUN_AS_COMMAND"

// RunTestMainAsCommand is the TestMain of a package under cmd/ whose tests
// run the command as a real child process (its own logging setup, metrics
// registry and signals): started by Command, the test binary runs main,
// the command's own, with its arguments; otherwise it runs the tests.
//
//	func TestMain(m *testing.M) { testsupport.RunTestMainAsCommand(m, main) }
func RunTestMainAsCommand(m *testing.M, main func()) {
	if os.Getenv(asCommand) == "1" {
		// Processes the command starts are not the test binary's.
		os.Unsetenv(asCommand)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// Command is the test binary run as its package's command (see
// RunTestMainAsCommand) with args.
func Command(args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), asCommand+"=1")
	return cmd
}
