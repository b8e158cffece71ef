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
	"flag"
	"strconv"
	"testing"

	"github.com/latchcsi/latch/internal/testsupport"
)

// worldsAtOnce is how many parallel tests (each a world of its own: a
// control plane, its controllers and nodes) run at once when -parallel is
// not given. A world mostly waits (for kube-controller-manager's periods
// and its 2-minute attach timeout, leader election, the controllers'
// retries), so go test's default, one per CPU, left the 2-minute waits of
// TestNoAttacher_kcmAndLatchRecordTheSameTimeoutEvent blocking the
// matrix's pairs.
const worldsAtOnce = 4

func TestMain(m *testing.M) {
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		if err := flag.Set("test.parallel", strconv.Itoa(worldsAtOnce)); err != nil {
			panic(err)
		}
	}
	testsupport.RunTestMain(m)
}
