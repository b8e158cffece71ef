package attacher_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/latchcsi/latch/internal/csimock"
	"github.com/latchcsi/latch/internal/testsupport"
)

// These helpers run the real csi-attacher binary as a child process, so
// tests can kill it (SIGKILL), stop it (SIGTERM), read its logs and scrape
// its HTTP endpoint exactly as Kubernetes and Prometheus would.

// attacherBinary builds cmd/csi-attacher once per test binary.
func attacherBinary(t *testing.T) string {
	t.Helper()
	return testsupport.MustBinary(t, "cmd/csi-attacher")
}

// child is one csi-attacher process.
type child struct {
	t    *testing.T
	name string
	cmd  *exec.Cmd
	out  *testsupport.SyncBuffer // stdout and stderr
	done chan struct{}
	err  error // from Wait, valid once done is closed
}

// kubeconfig writes an admin kubeconfig for the env's children, once.
func (e *env) kubeconfig() string {
	e.t.Helper()
	if e.kubeconfigPath != "" {
		return e.kubeconfigPath
	}
	dir, err := os.MkdirTemp("", "latch-kc")
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "kubeconfig")
	if err := cluster.WriteKubeconfig(path); err != nil {
		e.t.Fatal(err)
	}
	e.kubeconfigPath = path
	return path
}

// startBinary runs csi-attacher against the env's driver socket. args come
// after the defaults, so a test can override them.
func (e *env) startBinary(name string, args ...string) *child {
	e.t.Helper()
	all := append([]string{
		"--csi-address=" + e.socket,
		"--kubeconfig=" + e.kubeconfig(),
		"--timeout=30s",
		"--retry-interval-start=100ms",
		"--reconcile-sync=0",
		"--worker-threads=4",
	}, args...)
	c := &child{t: e.t, name: name, cmd: exec.Command(attacherBinary(e.t), all...), out: &testsupport.SyncBuffer{}, done: make(chan struct{})}
	c.cmd.Stdout, c.cmd.Stderr = c.out, c.out
	// The binary's own GOMAXPROCS decision is under test (--max-procs):
	// keep the test runner's out of it.
	c.cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "GOMAXPROCS=") })
	if err := c.cmd.Start(); err != nil {
		e.t.Fatalf("start csi-attacher %s: %v", name, err)
	}
	go func() {
		c.err = c.cmd.Wait()
		close(c.done)
	}()
	e.t.Cleanup(func() {
		select {
		case <-c.done:
		default:
			_ = c.cmd.Process.Kill()
			<-c.done
		}
		if e.t.Failed() {
			e.t.Logf("csi-attacher %s output (last 4000 bytes):\n%s", name, tail(c.out.String(), 4000))
		}
	})
	return c
}

// kill is SIGKILL: no drain, no lease release, nothing.
func (c *child) kill() {
	c.t.Helper()
	if err := c.cmd.Process.Kill(); err != nil {
		c.t.Fatalf("kill csi-attacher %s: %v", c.name, err)
	}
	<-c.done
}

func (c *child) signal(sig os.Signal) {
	c.t.Helper()
	if err := c.cmd.Process.Signal(sig); err != nil {
		c.t.Fatalf("signal csi-attacher %s: %v", c.name, err)
	}
}

// exitCode waits for the process to exit and returns its exit code.
func (c *child) exitCode(timeout time.Duration) int {
	c.t.Helper()
	select {
	case <-c.done:
	case <-time.After(timeout):
		c.t.Fatalf("csi-attacher %s did not exit within %s", c.name, timeout)
	}
	if c.err == nil {
		return 0
	}
	if ee, ok := c.err.(*exec.ExitError); ok {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			c.t.Fatalf("csi-attacher %s was killed by %s", c.name, ws.Signal())
		}
		return ee.ExitCode()
	}
	c.t.Fatalf("csi-attacher %s: %v", c.name, c.err)
	return -1
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

// inFlight reports whether a call of method on volumeID has started and not
// returned.
func (e *env) inFlight(method, volumeID string) bool {
	for _, c := range e.driver.CallsTo(method) {
		if c.VolumeID == volumeID && !c.Done() {
			return true
		}
	}
	return false
}

// callsFor returns the calls of method on volumeID, oldest first.
func (e *env) callsFor(method, volumeID string) []csimock.Call {
	var out []csimock.Call
	for _, c := range e.driver.CallsTo(method) {
		if c.VolumeID == volumeID {
			out = append(out, c)
		}
	}
	return out
}

// scrape fetches url and parses its samples.
func scrape(t *testing.T, url string) testsupport.Samples {
	t.Helper()
	samples, err := testsupport.Scrape(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	return samples
}
