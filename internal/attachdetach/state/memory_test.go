package state

import (
	"fmt"
	"runtime"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/latchcsi/latch/internal/attachdetach/volume"
	"github.com/latchcsi/latch/internal/testsupport/heap"
)

// BenchmarkStateHeapPerVolume reports the live heap the desired and the
// actual state hold per volume (one Pod wanting it, attached and reported,
// ten volumes per node), as the bytes/volume metric: go test -run '^$'
// -bench StateHeap ./internal/attachdetach/state/. Before the states kept
// their per-volume sets in slices (a map's smallest table holds eight
// entries), it was about 2,550 bytes, and 1,313 before a volume and its
// pod shared one copy of the resolution; docs/scale.md has the per-object
// costs of the whole controller.
func BenchmarkStateHeapPerVolume(b *testing.B) {
	const volumes = 20000
	for range b.N {
		before := heap.Live()
		d, a := NewDesired(), NewActual()
		for n := range volumes / 10 {
			d.AddNode(fmt.Sprintf("node-%d", n), true)
		}
		for i := range volumes {
			node := fmt.Sprintf("node-%d", i/10)
			at := volume.NewAttachable("disk.csi.example.com", fmt.Sprintf("vol-%d", i))
			at.PVName = fmt.Sprintf("pv-%d", i)
			at.SpecName = at.PVName
			at.AccessModes = []v1.PersistentVolumeAccessMode{v1.ReadWriteOnce}
			pod := PodRef{Namespace: "ns", Name: fmt.Sprintf("pod-%d", i), UID: types.UID(fmt.Sprintf("uid-%d", i))}
			if _, ok := d.AddPod(pod, node, []volume.Attachable{at}); !ok {
				b.Fatalf("AddPod on %s refused", node)
			}
			a.Apply(Key{Volume: at.UniqueName, Node: node}, Update{State: StateAttached, ReportedInNodeStatus: true, Spec: &at})
		}
		after := heap.Live()
		b.ReportMetric(float64(after-before)/volumes, "bytes/volume")
		runtime.KeepAlive(d)
		runtime.KeepAlive(a)
	}
}
