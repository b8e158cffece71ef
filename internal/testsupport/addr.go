package testsupport

import (
	"net"
	"testing"
)

// FreeAddr returns a loopback host:port that nothing listens on right now,
// for a test to hand to a server it starts (the port may be taken again
// between this call and the server's listen; on loopback that is rare).
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}
