package stack

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"k8s.io/client-go/kubernetes"

	"github.com/latchcsi/latch/internal/localcluster"
)

// Worlds numbers the tests of one end-to-end package on a shared API
// server: each test's world gets its own prefix, namespace and driver
// name, so its controllers never act on what an earlier test left.
type Worlds struct {
	// Prefix starts every name: "ad" gives ad1, ad1-ns and
	// ad1.csi.latch.test to the first world.
	Prefix string
	seq    atomic.Int32
}

// World is one test's names.
type World struct {
	// Prefix is Worlds.Prefix and the world's number.
	Prefix string
	// Namespace exists once New returns.
	Namespace string
	// Driver is the CSI driver name.
	Driver string
}

// New numbers the next world and creates its namespace, failing t when
// it cannot. driver, when set, replaces the numbered driver name.
func (w *Worlds) New(t testing.TB, ctx context.Context, client kubernetes.Interface, driver string) World {
	t.Helper()
	p := fmt.Sprintf("%s%d", w.Prefix, w.seq.Add(1))
	world := World{Prefix: p, Namespace: p + "-ns", Driver: p + ".csi.latch.test"}
	if driver != "" {
		world.Driver = driver
	}
	if err := localcluster.CreateNamespace(ctx, client, world.Namespace); err != nil {
		t.Fatal(err)
	}
	return world
}

// NextPrefix is the prefix the next New gives (for a test that derives
// its driver name from it).
func (w *Worlds) NextPrefix() string {
	return fmt.Sprintf("%s%d", w.Prefix, w.seq.Load()+1)
}
