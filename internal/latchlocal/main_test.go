package latchlocal

import (
	"testing"

	"github.com/latchcsi/latch/internal/testsupport"
)

// TestMain removes the upstream binaries RealNodes built.
func TestMain(m *testing.M) { testsupport.RunTestMain(m) }
