package stack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"sync/atomic"
	"syscall"
	"time"
)

// Process runs binary with args as a component: Stop sends SIGTERM, and
// SIGKILL when the process has not exited 30 seconds later. Its stdout and
// stderr go to out (nil: discarded). Only exit status 0 after SIGTERM is a
// clean stop.
func Process(ctx context.Context, name string, out io.Writer, binary string, args ...string) (*Component, error) {
	c, _, err := child(ctx, name, out, exitedZero, binary, args...)
	return c, err
}

// exitedZero: the process ended with exit status 0.
func exitedZero(err error) bool { return err == nil }

// child starts binary with args as a component. Stop sends SIGTERM and
// waits up to 30 seconds before SIGKILL; clean says whether the process's
// end after SIGTERM (cmd.Wait's error) is a clean stop. Any end before Stop
// is an error, except after crash, which SIGKILLs the process at once (a
// test's "the node died").
func child(ctx context.Context, name string, out io.Writer, clean func(error) bool, binary string, args ...string) (*Component, func(), error) {
	cmd := exec.Command(binary, args...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("start %s (%s): %w", name, binary, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var crashed atomic.Bool
	crash := func() {
		crashed.Store(true)
		_ = cmd.Process.Kill()
	}
	return Go(ctx, name, func(ctx context.Context) error {
		select {
		case err := <-exited:
			if crashed.Load() {
				return nil
			}
			return fmt.Errorf("exited early: %v", err)
		case <-ctx.Done():
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if !clean(err) {
				return fmt.Errorf("exited after SIGTERM: %v", err)
			}
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			return errors.New("killed: did not exit within 30s of SIGTERM")
		}
		return ctx.Err()
	}), crash, nil
}

// diedOf reports whether err is the exit of a process killed by sig.
func diedOf(err error, sig syscall.Signal) bool {
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		return false
	}
	ws, ok := exit.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == sig
}
