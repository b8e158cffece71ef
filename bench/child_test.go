package bench

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"regexp"
	"testing"
	"time"
)

// childTestEnv, set in a child process of the test binary, makes TestMain
// run the tests without starting the package's API server.
const childTestEnv = "LATCH_BENCH_CHILD_TEST"

// runInChild runs the calling test again in a child process of the test
// binary that starts no API server, and makes the child's result and
// output this test's; it returns true when it did so, and false in the
// child, where the test goes on and runs. A test that measures the live
// heap runs there: with the API server in the process, every collection
// also scans the server's heap (slow on two cores), and the server's own
// allocations move the live heap by more than what is measured.
func runInChild(t *testing.T, timeout time.Duration) bool {
	t.Helper()
	if os.Getenv(childTestEnv) != "" {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0],
		"-test.run=^"+regexp.QuoteMeta(t.Name())+"$", "-test.count=1", "-test.v", "-test.timeout="+timeout.String())
	cmd.Env = append(os.Environ(), childTestEnv+"=1")
	out, err := cmd.CombinedOutput()
	t.Logf("%s in a child process without the API server:\n%s", t.Name(), out)
	if err != nil {
		t.Fatalf("%s in a child process: %v", t.Name(), err)
	}
	if !bytes.Contains(out, []byte("--- PASS: "+t.Name()+" (")) {
		t.Fatalf("the child process did not run %s", t.Name())
	}
	return true
}
