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
				if !n.ForgetIf(name, k, func() bool { return true }) {
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
