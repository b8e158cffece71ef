package testsupport

import (
	"strings"
	"testing"
)

// StopHollowKubelet is the end-of-test cleanup of the hollow node name
// whose kubelet wrote to log: it stops the kubelet (an error fails the
// test) and, when the test has failed, logs the last lines of what the
// kubelet wrote.
func StopHollowKubelet(t testing.TB, name string, kubelet interface{ Stop() error }, log *SyncBuffer, lines int) {
	t.Helper()
	if err := kubelet.Stop(); err != nil {
		t.Errorf("hollow node %s: %v", name, err)
	}
	if t.Failed() {
		t.Logf("hollow kubelet %s log (tail):\n%s", name, LastLines(log.String(), lines))
	}
}

// LastLines is the last n lines of s; all of s when it has no more.
func LastLines(s string, n int) string {
	l := strings.Split(s, "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}
