package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Scenarios A and D repeat their burst and judge their speed targets on
// the median burst: the machine's speed drifts from minute to minute, and
// one burst that meets a slow minute says more about the minute than about
// the components. Correctness is checked on every burst.

// phaseNamer names a burst's phases: "attach" when there is one burst,
// "attach 2" for the second of several.
func phaseNamer(bursts, b int) func(string) string {
	if bursts <= 1 {
		return func(phase string) string { return phase }
	}
	return func(phase string) string { return fmt.Sprintf("%s %d", phase, b+1) }
}

// medianOf is the run whose key is the median (the lower middle one of an
// even count). runs must not be empty.
func medianOf[T any](runs []T, key func(T) float64) T {
	s := slices.Clone(runs)
	slices.SortStableFunc(s, func(a, b T) int { return cmp.Compare(key(a), key(b)) })
	return s[(len(s)-1)/2]
}

// eachOf prints f of every run, in order: "100" for one run, "100, 98,
// 100 in the 3 bursts" for several.
func eachOf[T any](runs []T, f func(T) string) string {
	vs := make([]string, len(runs))
	for i, run := range runs {
		vs[i] = f(run)
	}
	if len(vs) == 1 {
		return vs[0]
	}
	return fmt.Sprintf("%s in the %d bursts", strings.Join(vs, ", "), len(vs))
}

// allOf holds when ok holds for every run.
func allOf[T any](runs []T, ok func(T) bool) bool {
	return !slices.ContainsFunc(runs, func(run T) bool { return !ok(run) })
}

// medianValue prints a median judged over runs: "1229 ms" for one run,
// "1229 ms, the median of 977 ms, 1288 ms, 1229 ms in the 3 bursts" for
// several.
func medianValue[T any](runs []T, median string, f func(T) string) string {
	if len(runs) == 1 {
		return median
	}
	return median + ", the median of " + eachOf(runs, f)
}

// runBursts runs one burst after another on Pods or volumes of their own
// (span(n, b*n) for burst b) and returns what each measured, stopping at
// the first that fails; a failed burst's partial measurement is kept.
func runBursts[R any](bursts, n int, one func(idx []int, name func(string) string) (*R, error)) ([]*R, error) {
	var runs []*R
	for b := range bursts {
		run, err := one(span(n, b*n), phaseNamer(bursts, b))
		if run != nil {
			runs = append(runs, run)
		}
		if err != nil {
			return runs, err
		}
	}
	return runs, nil
}

// judgedAround runs a judged scenario's bursts between two probes of the
// limit (limitBefore, limitAround) and then judges what they measured
// against the better of the probes.
func judgedAround[R any](ctx context.Context, e *env, res *Result, bursts func() ([]*R, error), judge func([]*R)) error {
	before, err := e.limitBefore(ctx, res)
	if err != nil {
		return err
	}
	runs, err := bursts()
	err = errors.Join(err, e.limitAround(ctx, res, before))
	judge(runs)
	return err
}
