package state_test

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/latchcsi/latch/internal/attachdetach/state"
	"github.com/latchcsi/latch/internal/kube/kubenames"
)

// Controller-made names (kept as digests) and any other name index the
// same way, and a name is only ever found under itself.
func TestNames_everyFormOfName(t *testing.T) {
	made := kubenames.VolumeAttachmentName("h1", "d", "node-a")
	k1, k2 := key("h1", "node-a"), key("h2", "node-a")
	for _, tc := range []struct {
		name string
		set  map[string]state.Key
		// want is what Get returns per name; a name missing from want is
		// not found.
		want   map[string]state.Key
		absent []string
	}{
		{
			name: "a controller-made name",
			set:  map[string]state.Key{made: k1},
			want: map[string]state.Key{made: k1},
			absent: []string{strings.ToUpper(made[:4]) + made[4:], "csi-" + strings.ToUpper(made[4:]), made[:len(made)-1],
				made + "0", "csx-" + made[4:], made[:10] + "g" + made[11:]},
		},
		{
			name:   "a name of another form",
			set:    map[string]state.Key{"va-1": k1},
			want:   map[string]state.Key{"va-1": k1},
			absent: []string{made, "va-2"},
		},
		{
			name: "the same digest in capitals is another name",
			set:  map[string]state.Key{made: k1, "csi-" + strings.ToUpper(made[4:]): k2},
			want: map[string]state.Key{made: k1, "csi-" + strings.ToUpper(made[4:]): k2},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := state.NewNames()
			for name, k := range tc.set {
				n.Set(name, k)
			}
			if n.Len() != len(tc.set) {
				t.Errorf("Len = %d, want %d", n.Len(), len(tc.set))
			}
			for name, k := range tc.want {
				if got, ok := n.Get(name); !ok || got != k {
					t.Errorf("Get(%q) = %v, %v; want %v", name, got, ok, k)
				}
			}
			for _, name := range tc.absent {
				if got, ok := n.Get(name); ok {
					t.Errorf("Get(%q) = %v, want not found", name, got)
				}
			}
			// GetDigest answers as Get for every name that spells a digest.
			for _, name := range append(slices.Collect(maps.Keys(tc.want)), tc.absent...) {
				d, ok := kubenames.VolumeAttachmentNameDigest(name)
				if !ok {
					continue
				}
				wantKey, wantOK := n.Get(name)
				if got, ok := n.GetDigest(d); ok != wantOK || got != wantKey {
					t.Errorf("GetDigest of %q = %v, %v; Get = %v, %v", name, got, ok, wantKey, wantOK)
				}
			}
			for name, k := range tc.set {
				if !n.ForgetIf(name, k, true) {
					t.Errorf("ForgetIf(%q) kept it", name)
				}
				if _, ok := n.Get(name); ok {
					t.Errorf("Get(%q) found it after ForgetIf", name)
				}
			}
			if n.Len() != 0 {
				t.Errorf("Len = %d after every name was forgotten", n.Len())
			}
		})
	}
}

// An event of the VolumeAttachment version the key's last pass decided on
// (our own create, read back through the overlay) needs no pass; any other
// version does, and an event during a pass is weighed when it ends.
func TestNames_eventOfTheVersionAPassDecidedOnWakesNothing(t *testing.T) {
	for _, name := range []string{kubenames.VolumeAttachmentName("h1", "d", "node-a"), "made-by-hand"} {
		n := state.NewNames()
		k := key("h1", "node-a")
		created, attached := state.VersionOf("uid-1", "10"), state.VersionOf("uid-1", "11")
		if got, known, wake := n.Observe(name, created); known || wake || got != (state.Key{}) {
			t.Fatalf("%s: unknown name observed as %v known=%v wake=%v", name, got, known, wake)
		}
		n.Set(name, k)
		if _, known, wake := n.Observe(name, created); !known || !wake {
			t.Fatalf("%s: no pass decided yet: known=%v wake=%v, want a pass", name, known, wake)
		}

		// A pass creates the VolumeAttachment and decides on it; the
		// informer's event of that version comes during the pass.
		n.Pass(name)
		if _, _, wake := n.Observe(name, created); wake {
			t.Fatalf("%s: event during a pass woke the key", name)
		}
		if n.PassDone(name, created, true) {
			t.Fatalf("%s: the pass decided on the version the event brought, yet asks for another", name)
		}
		if _, _, wake := n.Observe(name, created); wake {
			t.Fatalf("%s: the version the last pass decided on woke the key", name)
		}
		if got, _, wake := n.Observe(name, attached); !wake || got != k {
			t.Fatalf("%s: a new version (attached) did not wake %v: got %v wake=%v", name, k, got, wake)
		}

		// An event of a newer version during a pass: the pass ends, the
		// key runs again.
		n.Pass(name)
		n.Observe(name, attached)
		if !n.PassDone(name, created, true) {
			t.Fatalf("%s: an event newer than the pass's decision was dropped", name)
		}
		// A failed pass remembers nothing: the next event runs a pass.
		n.Pass(name)
		n.Observe(name, created)
		if !n.PassDone(name, created, false) {
			t.Fatalf("%s: an event during a failed pass was dropped", name)
		}
		if _, _, wake := n.Observe(name, created); !wake {
			t.Fatalf("%s: after a failed pass, an event of the version it saw must run a pass", name)
		}
	}
}
