package latchlocal

import (
	"os"
	"testing"

	"github.com/latchcsi/latch/internal/testsupport"
)

// TestMain removes the upstream binaries RealNodes built.
func TestMain(m *testing.M) {
	code := m.Run()
	testsupport.RemoveBinaries()
	os.Exit(code)
}
