package interop

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestInteropMatrix runs every scenario on each of the four pairs, one
// control plane per pair and the scenarios in sequence, then checks that
// each scenario observed the same facts on every pair.
func TestInteropMatrix(t *testing.T) {
	results := map[string]map[pair]outcome{}
	for _, p := range pairs {
		t.Run(p.String(), func(t *testing.T) {
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
						if results[sc.name] == nil {
							results[sc.name] = map[pair]outcome{}
						}
						results[sc.name][p] = o
					}
				})
			}
		})
	}
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
}
