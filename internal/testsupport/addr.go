package testsupport

import (
	"errors"
	"math/rand/v2"
	"net"
	"strconv"
	"testing"
)

// FreeLoopbackAddr returns a loopback host:port that nothing listens on
// right now, for a server a test starts (in-process or as a child
// process). The port is taken below Linux's ephemeral range (32768-60999
// by default): a port the kernel hands out for port 0 is soon handed to
// some outgoing connection again once freed, and a child told to listen
// on it exits ("bind: address already in use"; seen in CI with a hollow
// kubelet). Ports below the range are never given to outgoing
// connections; two tests picking the same one at once is left to chance
// (one in 12,000).
func FreeLoopbackAddr() (string, error) {
	for range 100 {
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(20000+rand.IntN(12000)))
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		ln.Close()
		return addr, nil
	}
	return "", errors.New("find a free loopback port: 100 ports between 20000 and 32000 were all taken")
}

// FreeAddr is FreeLoopbackAddr that fails the test.
func FreeAddr(t testing.TB) string {
	t.Helper()
	addr, err := FreeLoopbackAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}
