package stack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"syscall"
	"time"
)

// Process runs binary with args as a component: Stop sends SIGTERM, and
// SIGKILL when the process has not exited 30 seconds later. Its stdout and
// stderr go to out (nil: discarded).
func Process(ctx context.Context, name string, out io.Writer, binary string, args ...string) (*Component, error) {
	cmd := exec.Command(binary, args...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s (%s): %w", name, binary, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	return Go(ctx, name, func(ctx context.Context) error {
		select {
		case err := <-exited:
			return fmt.Errorf("exited early: %v", err)
		case <-ctx.Done():
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			var exit *exec.ExitError
			if err != nil && !errors.As(err, &exit) {
				return err
			}
			if err != nil && exit.ExitCode() != 0 {
				return fmt.Errorf("exited after SIGTERM: %v", err)
			}
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			return errors.New("killed: did not exit within 30s of SIGTERM")
		}
		return ctx.Err()
	}), nil
}
