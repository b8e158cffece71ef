package testsupport

import (
	"context"
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
