package stack

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestComponentStopCancelsWaitsAndReportsOnlyRealErrors(t *testing.T) {
	ctx := context.Background()
	clean := Go(ctx, "clean", func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() })
	if err := clean.Stop(); err != nil {
		t.Errorf("a component that ended on cancellation: Stop = %v, want nil", err)
	}
	failing := Go(ctx, "failing", func(ctx context.Context) error { <-ctx.Done(); return errors.New("lost the driver") })
	if err := failing.Stop(); err == nil || !strings.Contains(err.Error(), "failing: lost the driver") {
		t.Errorf("Stop = %v, want the component's error naming it", err)
	}
	if err := failing.Stop(); err == nil {
		t.Error("a second Stop lost the error")
	}
	release := make(chan struct{})
	stuck := Go(ctx, "stuck", func(context.Context) error { <-release; return nil })
	stuck.StopTimeout = 50 * time.Millisecond
	if err := stuck.Stop(); err == nil || !strings.Contains(err.Error(), "stuck did not stop") {
		t.Errorf("Stop of a component that ignores its context = %v, want a timeout naming it", err)
	}
	close(release)
	<-stuck.Exited()
}

func TestStackReportsAComponentThatEndsOnItsOwn(t *testing.T) {
	s := &Stack{errs: make(chan error, 1)}
	c := Go(context.Background(), "csi-attacher", func(context.Context) error { return errors.New("lost connection to the CSI driver") })
	s.watch(c)
	select {
	case err := <-s.Err():
		if !strings.Contains(err.Error(), "csi-attacher: lost connection") {
			t.Errorf("Err = %v, want it to name the component and the cause", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no error reported for a component that ended on its own")
	}
}
