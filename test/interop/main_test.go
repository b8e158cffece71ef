// Package interop runs latch beside and instead of the real upstream
// components: the external-attacher v4.13.0 sidecar and
// kube-controller-manager v1.37.2's attach/detach controller, both built
// from the pinned modules under test/upstream (testsupport.UpstreamBinary;
// the first build of kube-controller-manager takes minutes). The matrix
// runs one scenario set on all four pairs {kcm A/D, latch A/D} ×
// {upstream attacher, latch attacher}; the swap tests replace each
// upstream component by latch's and back while volumes attach and detach.
// docs/interop.md lists what each test asserts and what is not run.
package interop

import (
	"testing"

	"github.com/latchcsi/latch/internal/testsupport"
)

func TestMain(m *testing.M) { testsupport.RunTestMain(m) }
