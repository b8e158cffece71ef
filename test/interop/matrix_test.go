package interop

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestInteropMatrix runs every scenario on each of the four pairs, one
// control plane per pair, the pairs at once (each its own world: its own
// API server, nodes, driver and controllers) and the scenarios of a pair in
// sequence, then checks that each scenario observed the same facts on
// every pair.
func TestInteropMatrix(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	results := map[string]map[pair]outcome{}
	// Once every pair's subtest has ended (they run in parallel).
	t.Cleanup(func() {
		for _, sc := range scenarios {
			ref := pairs[len(pairs)-1] // latch + latch
			want, ok := results[sc.name][ref]
			if !ok {
				continue
			}
			for _, p := range pairs[:len(pairs)-1] {
				got, ok := results[sc.name][p]
				if !ok {
					continue
				}
				if !slices.Equal(got, want) {
					t.Errorf("%s: %s observed\n  %s\nbut %s observed\n  %s", sc.name, p, strings.Join(got, "\n  "), ref, strings.Join(want, "\n  "))
				}
			}
		}
	})
	for _, p := range pairs {
		t.Run(p.String(), func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
			defer cancel()
			w := newWorld(t, ctx, p)
			for _, sc := range scenarios {
				t.Run(sc.name, func(t *testing.T) {
					parent := w.t
					w.t = t
					defer func() { w.t = parent }()
					var o outcome
					sc.run(w, &o)
					if !t.Failed() {
						mu.Lock()
						if results[sc.name] == nil {
							results[sc.name] = map[pair]outcome{}
						}
						results[sc.name][p] = o
						mu.Unlock()
					}
				})
			}
		})
	}
}
