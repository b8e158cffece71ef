package localcluster

import (
	"errors"
	"io"
	"net"
	"sync"
)

// frontProxy gives the API server a loopback address that survives restarts.
// kube-apiserver's test server always binds a fresh port; clients (and the
// kubeconfig handed to external binaries) talk to this proxy instead, which
// forwards raw TCP (TLS stays end to end) to whichever API server is current.
// When the backend goes away every open connection is closed, so clients see
// exactly what they would see from a real API server restart.
type frontProxy struct {
	ln net.Listener

	mu      sync.Mutex
	backend string // "" while no API server runs: new connections are refused
	conns   map[net.Conn]struct{}
	closed  bool
	wg      sync.WaitGroup
}

func newFrontProxy() (*frontProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &frontProxy{ln: ln, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

func (p *frontProxy) addr() string { return p.ln.Addr().String() }

// setBackend points new connections at addr; "" drops all current
// connections and refuses new ones until a backend is set again.
func (p *frontProxy) setBackend(addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if addr == p.backend {
		return
	}
	p.backend = addr
	for c := range p.conns {
		c.Close()
	}
}

func (p *frontProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		p.mu.Lock()
		backend, closed := p.backend, p.closed
		p.mu.Unlock()
		if closed || backend == "" {
			c.Close()
			continue
		}
		p.wg.Add(1)
		go p.forward(c, backend)
	}
}

func (p *frontProxy) forward(client net.Conn, backend string) {
	defer p.wg.Done()
	server, err := net.Dial("tcp", backend)
	if err != nil {
		client.Close()
		return
	}
	p.mu.Lock()
	if p.closed || p.backend != backend {
		p.mu.Unlock()
		client.Close()
		server.Close()
		return
	}
	p.conns[client] = struct{}{}
	p.conns[server] = struct{}{}
	p.mu.Unlock()

	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		// Closing both ends on either side's EOF keeps half-open
		// connections from lingering after a backend stop.
		dst.Close()
		src.Close()
		done <- struct{}{}
	}
	go pipe(server, client)
	go pipe(client, server)
	<-done
	<-done

	p.mu.Lock()
	delete(p.conns, client)
	delete(p.conns, server)
	p.mu.Unlock()
}

func (p *frontProxy) close() {
	p.mu.Lock()
	p.closed = true
	p.backend = ""
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.ln.Close()
	p.wg.Wait()
}
