package testsupport

import (
	"os"
	"testing"
)

// RunTestMain is a test package's TestMain body for tests that build
// binaries (Binary, UpstreamBinary) but share no control plane: it runs
// the tests, removes what they built (RemoveBinaries) and exits with the
// tests' code.
//
//	func TestMain(m *testing.M) { testsupport.RunTestMain(m) }
func RunTestMain(m *testing.M) {
	code := m.Run()
	RemoveBinaries()
	os.Exit(code)
}
