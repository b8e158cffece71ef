package testsupport

import (
	"os"
	"testing"
)

// SocketDir is a new directory for a test's unix sockets, removed when the
// test ends. Its path is short: a socket path is limited to about 108
// bytes, which t.TempDir (named after the test) can exceed.
func SocketDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "sock")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
