package bench

import (
	"bytes"
	"context"
	"flag"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// childTestEnv, set in a child process of the test binary, makes TestMain
// run the tests without starting the package's API server.
const childTestEnv = "LATCH_BENCH_CHILD_TEST"

// childTests are the tests that run in a child process (runInChild), with
// the time each may take there.
var childTests = map[string]time.Duration{
	"TestObjectCostSmallWorld": 5 * time.Minute,
}

// child is a child process running one test.
type child struct {
	cmd    *exec.Cmd
	out    bytes.Buffer
	done   chan struct{}
	err    error
	cancel context.CancelFunc
}

// children are the child processes started before the tests ran, by test
// name; runInChild takes its test's.
var children struct {
	mu     sync.Mutex
	byTest map[string]*child
}

// startChild runs test in a child process of the test binary.
func startChild(test string, timeout time.Duration) (*child, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	c := &child{done: make(chan struct{}), cancel: cancel}
	c.cmd = exec.CommandContext(ctx, os.Args[0],
		"-test.run=^"+regexp.QuoteMeta(test)+"$", "-test.count=1", "-test.v", "-test.timeout="+timeout.String())
	c.cmd.Env = append(os.Environ(), childTestEnv+"=1")
	c.cmd.Stdout, c.cmd.Stderr = &c.out, &c.out
	if err := c.cmd.Start(); err != nil {
		cancel()
		return nil, err
	}
	go func() {
		c.err = c.cmd.Wait()
		cancel()
		close(c.done)
	}()
	return c, nil
}

// startChildren starts, before the tests run, the child process of every
// child test that this run selects: it works beside the tests that use
// the API server (it has its own process, heap and clientset), so the
// package takes less wall time. The flags must be parsed.
func startChildren() {
	children.byTest = map[string]*child{}
	if flagValue("test.list") != "" || flagValue("test.count") != "1" {
		return
	}
	for test, timeout := range childTests {
		if !selected(test) {
			continue
		}
		// A child that cannot start is started again by its test, which
		// then reports the error.
		if c, err := startChild(test, timeout); err == nil {
			children.byTest[test] = c
		}
	}
}

// stopChildren ends the child processes no test took.
func stopChildren() {
	children.mu.Lock()
	defer children.mu.Unlock()
	for _, c := range children.byTest {
		c.cancel()
		<-c.done
	}
	children.byTest = nil
}

func flagValue(name string) string {
	if f := flag.Lookup(name); f != nil {
		return f.Value.String()
	}
	return ""
}

// selected says whether -test.run and -test.skip select the top-level
// test (an invalid pattern selects nothing; go test reports it).
func selected(test string) bool {
	matches := func(pattern string) bool {
		first, _, _ := strings.Cut(pattern, "/")
		ok, err := regexp.MatchString(first, test)
		return ok && err == nil
	}
	if run := flagValue("test.run"); run != "" && !matches(run) {
		return false
	}
	if skip := flagValue("test.skip"); skip != "" && matches(skip) {
		return false
	}
	return true
}

// runInChild runs the calling test in a child process of the test binary
// that starts no API server (the one startChildren started, or a new
// one), and makes the child's result and output this test's; it returns
// true when it did so, and false in the child, where the test goes on and
// runs. A test that measures the live heap runs there: with the API
// server in the process, every collection also scans the server's heap
// (slow on two cores), and the server's own allocations move the live
// heap by more than what is measured.
func runInChild(t *testing.T) bool {
	t.Helper()
	if os.Getenv(childTestEnv) != "" {
		return false
	}
	timeout, ok := childTests[t.Name()]
	if !ok {
		t.Fatalf("%s is not among childTests", t.Name())
	}
	children.mu.Lock()
	c := children.byTest[t.Name()]
	delete(children.byTest, t.Name())
	children.mu.Unlock()
	if c == nil {
		var err error
		if c, err = startChild(t.Name(), timeout); err != nil {
			t.Fatalf("start %s in a child process: %v", t.Name(), err)
		}
	}
	<-c.done
	out := c.out.Bytes()
	t.Logf("%s in a child process without the API server:\n%s", t.Name(), out)
	if c.err != nil {
		t.Fatalf("%s in a child process: %v", t.Name(), c.err)
	}
	if !bytes.Contains(out, []byte("--- PASS: "+t.Name()+" (")) {
		t.Fatalf("the child process did not run %s", t.Name())
	}
	return true
}
