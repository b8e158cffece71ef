package testsupport

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestEventuallyWaitsAndFailsNamingWhat(t *testing.T) {
	n := 0
	Eventually(t, context.Background(), time.Second, "third check", func(context.Context) (bool, error) {
		n++
		return n >= 3, nil
	})
	if n != 3 {
		t.Errorf("checked %d times, want 3", n)
	}
	f := &fatalRecorder{}
	logged := false
	Eventually(f, context.Background(), 50*time.Millisecond, "never", func(context.Context) (bool, error) { return false, nil }, func() { logged = true })
	if f.msg == "" || !logged {
		t.Errorf("Eventually on a condition that never holds: fatal %q, onFail ran %v", f.msg, logged)
	}
}

func TestConsistentlyHoldsForItsWholeTimeAndFailsAtTheFirstLapse(t *testing.T) {
	n := 0
	Consistently(t, context.Background(), 250*time.Millisecond, "always", func(context.Context) (bool, error) {
		n++
		return true, nil
	})
	if n < 3 {
		t.Errorf("checked %d times in 250 ms, want at least 3 (every %s and once at the end)", n, ConsistentlyInterval)
	}
	f := &fatalRecorder{}
	logged := false
	n = 0
	Consistently(f, context.Background(), time.Minute, "the volume attached", func(context.Context) (bool, error) {
		n++
		return n < 2, nil
	}, func() { logged = true })
	if !strings.HasPrefix(f.msg, "the volume attached stopped holding after ") || !strings.HasSuffix(f.msg, ": condition false") || !logged || n != 2 {
		t.Errorf("Consistently on a condition that lapses at the second check: fatal %q, onFail ran %v, checks %d", f.msg, logged, n)
	}
	f = &fatalRecorder{}
	Consistently(f, context.Background(), time.Minute, "the list", func(context.Context) (bool, error) { return true, errors.New("connection refused") })
	if !strings.HasSuffix(f.msg, ": connection refused") {
		t.Errorf("Consistently on a failing check: fatal %q, want the error", f.msg)
	}
}
